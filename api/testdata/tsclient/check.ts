// Compiled with tsc --strict --noEmit against the client openapi-typescript generates from the
// OpenAPI document (scripts/tsclient.sh): an integrator's code that uses the §19 fields, with no
// cast anywhere. It fails to compile when the document stops describing them as the contract
// has them (docs/api-contract.md §19): attributes an object of string, number or boolean
// values, tags a string[], attr a deepObject query parameter of strings, GET /tags and the
// tags operation.
import createClient from "openapi-fetch";
import type { components, paths } from "./schema";

type Subscriber = components["schemas"]["Subscriber"];
type TagCount = components["schemas"]["TagCount"];

// Exact type equality: a field typed any or unknown does not pass.
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
function exact<A, B>(ok: Equal<A, B>): void {
  void ok;
}
exact<Subscriber["attributes"], { [key: string]: string | number | boolean }>(true);
exact<Subscriber["tags"], string[]>(true);
exact<TagCount, { tag: string; subscribers: number }>(true);
type ListQuery = NonNullable<paths["/api/v1/subscribers"]["get"]["parameters"]["query"]>;
exact<ListQuery["attr"], { [key: string]: string } | undefined>(true);
exact<ListQuery["tag"], string[] | undefined>(true);
exact<ListQuery["not_tag"], string[] | undefined>(true);
exact<ListQuery["has_attr"], string[] | undefined>(true);

const client = createClient<paths>({ baseUrl: "http://127.0.0.1:8080", headers: { Authorization: "Bearer sk_test" } });

export async function integrate(): Promise<string[]> {
  const created = await client.POST("/api/v1/subscribers", {
    body: {
      email: "ada@example.com",
      name: "Ada Lovelace",
      // Optional in the document (default "pending"), but openapi-typescript's default
      // (defaultNonNullable) makes a property with a default required, in requests too.
      status: "active",
      attributes: { plan: "pro", seats: 5, trial: false },
      tags: ["beta", "vip"],
    },
  });
  if (created.error) {
    return [created.error.code, created.error.message];
  }
  const sub: Subscriber = created.data.data;
  const plan: string | number | boolean | undefined = sub.attributes["plan"];
  const seats = sub.attributes.seats;
  const seatCount = typeof seats === "number" ? seats + 1 : 0;

  // A merge patch: null removes a key.
  await client.PUT("/api/v1/subscribers/{id}", {
    params: { path: { id: sub.id } },
    body: { attributes: { plan: "team", trial: null }, tags: ["beta"] },
  });
  const changed = await client.POST("/api/v1/subscribers/{id}/tags", {
    params: { path: { id: sub.id } },
    body: { add: ["webinar-2026-11"], remove: ["vip"] },
  });
  const after: string[] = changed.data?.data.tags ?? [];

  const page = await client.GET("/api/v1/subscribers", {
    params: {
      query: {
        tag: ["beta"],
        not_tag: ["churned"],
        attr: { plan: "pro", seats: "5" },
        has_attr: ["trial"],
        created_after: "2026-01-01T00:00:00Z",
        limit: 25,
      },
    },
  });
  const emails: string[] = page.data?.data.map((s: Subscriber) => `${s.email} ${s.tags.join(",")}`) ?? [];
  const total: number | undefined = page.data?.pagination.total;

  const tags = await client.GET("/api/v1/tags", { params: { query: { limit: 100 } } });
  const counts: TagCount[] = tags.data?.data ?? [];
  const next: string | null | undefined = tags.data?.pagination.next_cursor;
  return [
    String(plan),
    String(seatCount),
    ...after,
    ...emails,
    String(total),
    ...counts.map((c) => `${c.tag}: ${c.subscribers}`),
    String(next),
  ];
}
