// Preloaded into Prism (node --require) by the integration suite's replay (prism_test.go).
// Prism 5.16.0 puts its violations, as JSON, in the sl-violations header as they are: a message
// that quotes a value with characters outside Latin-1 (an address in Unicode, §3) makes Node
// refuse the header, and Prism crashes. This writes those characters as JSON \u escapes: the
// same JSON, in a header Node accepts.
const http = require("node:http");
const setHeader = http.ServerResponse.prototype.setHeader;
http.ServerResponse.prototype.setHeader = function (name, value) {
  if (typeof value === "string" && String(name).toLowerCase() === "sl-violations") {
    value = value.replace(/[^\x20-\x7e]/g, (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
  }
  return setHeader.call(this, name, value);
};
