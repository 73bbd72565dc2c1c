// Package client is the subscriber API's client as oapi-codegen generates it from the served
// OpenAPI document (client.gen.go, written by integration.TestGeneratedClient next to this
// file in a copy of this module), and a test that uses it the way an integrator would.
package client

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"testing"

	"github.com/oapi-codegen/nullable"
)

// TestClient runs against the service at SUBSCRIBERD_URL with the key SUBSCRIBERD_KEY, a
// fresh newsletter with no subscribers.
func TestClient(t *testing.T) {
	server, key := os.Getenv("SUBSCRIBERD_URL"), os.Getenv("SUBSCRIBERD_KEY")
	if server == "" || key == "" {
		t.Skip("run by integration.TestGeneratedClient, which sets SUBSCRIBERD_URL and SUBSCRIBERD_KEY")
	}
	auth := func(_ context.Context, r *http.Request) error {
		r.Header.Set("Authorization", "Bearer "+key)
		return nil
	}
	c, err := NewClientWithResponses(server, WithRequestEditorFn(auth))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	str := func(s string) *string { return &s }

	// Create, and retry it with the same Idempotency-Key: the first response again, once.
	in := SubscriberInput{Email: "jane@example.com", Name: nullable.NewNullableWithValue("Jane Doe")}
	cr, err := c.CreateSubscriberWithResponse(ctx, &CreateSubscriberParams{IdempotencyKey: str("create-jane")}, in)
	if err != nil || cr.JSON201 == nil {
		t.Fatalf("create: %v, %d %s", err, cr.StatusCode(), cr.Body)
	}
	if d := cr.JSON201.Data; d.Email != "jane@example.com" || d.Name != "Jane Doe" || d.Status != SubscriberStatusActive {
		t.Errorf("create: %+v", d)
	}
	again, err := c.CreateSubscriberWithResponse(ctx, &CreateSubscriberParams{IdempotencyKey: str("create-jane")}, in)
	if err != nil || again.JSON201 == nil || again.JSON201.Data.Id != cr.JSON201.Data.Id ||
		again.HTTPResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retried create: %v, %d %s %v", err, again.StatusCode(), again.Body, again.HTTPResponse.Header)
	}

	// Bulk, with addresses whose domains (and a local part) are not ASCII: the client sends
	// them as given and the API keeps them as given.
	pending := SubscriberInputStatusPending
	unicode := []string{"user@bücher.example", "ünïcödé@例子.测试"}
	br, err := c.BulkCreateSubscribersWithResponse(ctx, &BulkCreateSubscribersParams{IdempotencyKey: str("bulk-1")},
		[]SubscriberInput{{Email: unicode[0]}, {Email: unicode[1], Status: &pending}})
	if err != nil || br.JSON201 == nil {
		t.Fatalf("bulk: %v, %d %s", err, br.StatusCode(), br.Body)
	}
	created := br.JSON201.Data.Created
	if len(created) != 2 || created[0].Email != unicode[0] || created[1].Email != unicode[1] || created[1].Status != SubscriberStatusPending {
		t.Fatalf("bulk created %+v", created)
	}
	id := created[0].Id

	// List: newest first, two a page, then the rest through next_cursor.
	limit := 2
	lr, err := c.ListSubscribersWithResponse(ctx, &ListSubscribersParams{Limit: &limit})
	if err != nil || lr.JSON200 == nil {
		t.Fatalf("list: %v, %d %s", err, lr.StatusCode(), lr.Body)
	}
	p := lr.JSON200.Pagination
	pages, pagesErr := p.Pages.Get()
	cursor, cursorErr := p.NextCursor.Get()
	if p.Total != 3 || pagesErr != nil || pages != 2 || len(lr.JSON200.Data) != 2 || cursorErr != nil {
		t.Fatalf("list: pagination %+v, %d items", p, len(lr.JSON200.Data))
	}
	next, err := c.ListSubscribersWithResponse(ctx, &ListSubscribersParams{Limit: &limit, Cursor: &cursor})
	if err != nil || next.JSON200 == nil {
		t.Fatalf("list by cursor: %v, %d %s", err, next.StatusCode(), next.Body)
	}
	if len(next.JSON200.Data) != 1 || next.JSON200.Data[0].Email != "jane@example.com" || !next.JSON200.Pagination.NextCursor.IsNull() {
		t.Errorf("list by cursor: %+v", *next.JSON200)
	}
	// Lookup by address, Unicode domain included.
	byEmail, err := c.ListSubscribersWithResponse(ctx, &ListSubscribersParams{Email: str(unicode[0])})
	if err != nil || byEmail.JSON200 == nil || len(byEmail.JSON200.Data) != 1 || byEmail.JSON200.Data[0].Id != id {
		t.Fatalf("lookup by email: %v, %d %s", err, byEmail.StatusCode(), byEmail.Body)
	}

	// Get.
	gr, err := c.GetSubscriberWithResponse(ctx, id)
	if err != nil || gr.JSON200 == nil || gr.JSON200.Data.Email != unicode[0] {
		t.Fatalf("get: %v, %d %s", err, gr.StatusCode(), gr.Body)
	}

	// Update one field: the others keep their values. name is ["string", "null"] (null clears
	// it), so the client is generated with nullable types: a name not set is not sent.
	jr, err := c.UpdateSubscriberWithResponse(ctx, cr.JSON201.Data.Id, &UpdateSubscriberParams{IdempotencyKey: str("update-jane")},
		SubscriberUpdate{Email: str("jane@bücher.example")})
	if err != nil || jr.JSON200 == nil {
		t.Fatalf("update: %v, %d %s", err, jr.StatusCode(), jr.Body)
	}
	if d := jr.JSON200.Data; d.Email != "jane@bücher.example" || d.Name != "Jane Doe" || d.Status != SubscriberStatusActive {
		t.Errorf("update of the email alone: %+v", d)
	}

	// Unsubscribe.
	dr, err := c.UnsubscribeSubscriberWithResponse(ctx, id, &UnsubscribeSubscriberParams{IdempotencyKey: str("unsubscribe-1")})
	if err != nil || dr.JSON200 == nil || dr.JSON200.Data.Status != SubscriberStatusUnsubscribed {
		t.Fatalf("unsubscribe: %v, %d %s", err, dr.StatusCode(), dr.Body)
	}

	// Upsert by email (1.2): the address in the path, as given (Unicode domain, upper case);
	// created the first time (201 with Location), updated after (200), the name kept when only
	// the status is given.
	up, err := c.UpsertSubscriberByEmailWithResponse(ctx, "Max@bücher.example",
		&UpsertSubscriberByEmailParams{IdempotencyKey: str("upsert-max")}, SubscriberUpsert{Name: nullable.NewNullableWithValue("Max Mustermann")})
	if err != nil || up.JSON201 == nil {
		t.Fatalf("upsert of a new address: %v, %d %s", err, up.StatusCode(), up.Body)
	}
	if d := up.JSON201.Data; d.Email != "Max@bücher.example" || d.Name != "Max Mustermann" || d.Status != SubscriberStatusActive ||
		up.HTTPResponse.Header.Get("Location") != fmt.Sprintf("/api/v1/subscribers/%v", d.Id) {
		t.Errorf("upsert created %+v, Location %q", d, up.HTTPResponse.Header.Get("Location"))
	}
	pendingUpsert := SubscriberUpsertStatusPending
	up2, err := c.UpsertSubscriberByEmailWithResponse(ctx, "max@BÜCHER.example", nil, SubscriberUpsert{Status: &pendingUpsert})
	if err != nil || up2.JSON200 == nil {
		t.Fatalf("upsert of an existing address: %v, %d %s", err, up2.StatusCode(), up2.Body)
	}
	if d := up2.JSON200.Data; d.Id != up.JSON201.Data.Id || d.Name != "Max Mustermann" || d.Status != SubscriberStatusPending {
		t.Errorf("upsert updated %+v, want the same subscriber, name kept, pending", d)
	}
	ue, err := c.UpsertSubscriberByEmailWithResponse(ctx, "not-an-address", nil, SubscriberUpsert{})
	if err != nil || ue.JSON422 == nil || len(ue.JSON422.Errors["email"]) != 1 {
		t.Fatalf("upsert of a bad address: %v, %d %s", err, ue.StatusCode(), ue.Body)
	}

	// A typed 422: field messages as a map of string arrays, no type assertion needed.
	er, err := c.CreateSubscriberWithResponse(ctx, nil, SubscriberInput{Email: "not-an-email"})
	if err != nil || er.JSON422 == nil {
		t.Fatalf("invalid create: %v, %d %s", err, er.StatusCode(), er.Body)
	}
	if got := er.JSON422.Errors["email"]; len(got) != 1 || got[0] != "The email field must be a valid email address." ||
		er.JSON422.Code != "validation_error" {
		t.Errorf("422: %+v", *er.JSON422)
	}
	// And the bulk keys <index>.<field>.
	bad, err := c.BulkCreateSubscribersWithResponse(ctx, nil, []SubscriberInput{{Email: "ok@example.com"}, {Email: "user@bücher.example"}})
	if err != nil || bad.JSON422 == nil {
		t.Fatalf("bulk with a taken address: %v, %d %s", err, bad.StatusCode(), bad.Body)
	}
	if got := bad.JSON422.Errors["1.email"]; len(got) != 1 || got[0] != "Email is already subscribed to this newsletter." {
		t.Errorf("bulk 422: %+v", *bad.JSON422)
	}

	// Version 1.2: export and erase the person, typed (last: its address is suppressed from then on).
	xr, err := c.ExportSubscriberWithResponse(ctx, id)
	if err != nil || xr.JSON200 == nil {
		t.Fatalf("export: %v, %d %s", err, xr.StatusCode(), xr.Body)
	}
	if d := xr.JSON200.Data; d.Subscriber.Id != id || d.Subscriber.Status != "unsubscribed" || len(d.Events) == 0 ||
		!d.Suppression.IsNull() || d.Emails == nil {
		t.Errorf("export: %+v", d)
	}
	xe, err := c.EraseSubscriberWithResponse(ctx, id, &EraseSubscriberParams{IdempotencyKey: str("erase-1")})
	if err != nil || xe.JSON200 == nil || xe.JSON200.Data.Id != id {
		t.Fatalf("erase: %v, %d %s", err, xe.StatusCode(), xe.Body)
	}
	if gone, err := c.ExportSubscriberWithResponse(ctx, id); err != nil || gone.StatusCode() != 404 {
		t.Fatalf("export after the erasure: %v, %d %s", err, gone.StatusCode(), gone.Body)
	}
}
