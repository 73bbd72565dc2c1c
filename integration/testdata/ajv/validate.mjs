// Validates response bodies against the OpenAPI 3.1 document, with Ajv's JSON Schema 2020-12
// validator (the dialect of a 3.1 document's schemas). Called by the integration suite's
// traffic check (integration/traffic_test.go):
//
//   node validate.mjs openapi.json answers.json
//
// answers.json is [{"method", "route", "status", "body"}]: each body is checked against the
// schema of its operation's response for its status, application/json. Prints the bodies that
// fail, as JSON: [{"method", "route", "status", "body", "errors"}].
import { readFileSync } from "node:fs";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const [docPath, answersPath] = process.argv.slice(2);
const doc = JSON.parse(readFileSync(docPath, "utf8"));
const answers = JSON.parse(readFileSync(answersPath, "utf8"));

// strict false: the document's own keywords (discriminator, example) are annotations here;
// oneOf alone tells the kinds apart.
const ajv = new Ajv2020({ strict: false, allErrors: true, validateSchema: false });
addFormats(ajv);
// Addresses with Unicode (§3): the service's own rule is stricter than any format's; the
// document says idn-email so that validators accept what the service accepts.
ajv.addFormat("idn-email", /^[^\s@]+@[^\s@]+$/u);
ajv.addSchema(doc, "openapi");

const esc = (s) => s.replaceAll("~", "~0").replaceAll("/", "~1");
const validators = new Map();
const problems = [];
for (const a of answers) {
  const ref = `openapi#/paths/${esc(a.route)}/${a.method.toLowerCase()}/responses/${a.status}/content/${esc("application/json")}/schema`;
  let validate = validators.get(ref);
  if (!validate) {
    validate = ajv.compile({ $ref: ref });
    validators.set(ref, validate);
  }
  if (!validate(JSON.parse(a.body))) {
    problems.push({ ...a, errors: validate.errors.slice(0, 5) });
  }
}
process.stdout.write(JSON.stringify(problems));
