package repo_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

func suppressionsDB(t *testing.T) (*repo.DB, *repo.Suppressions, *repo.Subscribers, uuid.UUID) {
	t.Helper()
	db, err := repo.Open(pg.Fresh(t), repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	nl, err := repo.NewAccounts(db).CreateNewsletter(context.Background(), "Weekly", true)
	if err != nil {
		t.Fatal(err)
	}
	return db, repo.NewSuppressions(db), repo.NewSubscribers(db), nl.ID
}

// TestSuppressionStore runs the store's operations on the configured engine: one entry per
// normalised address, the first reason kept, lookups by address and by hash, list order and
// filters, delete, and the check other writes make inside their transaction.
func TestSuppressionStore(t *testing.T) {
	db, sups, subs, nl := suppressionsDB(t)
	ctx := context.Background()

	first, created, err := sups.Create(ctx, nl, model.NewSuppression{Email: " Ada@Example.com ", Reason: model.ReasonComplaint,
		Source: model.SuppressionSource{Kind: model.SuppressionSourceAPI, APIKey: "sk_live_abc"}})
	if err != nil || !created {
		t.Fatalf("Create = %v, created %v", err, created)
	}
	if first.Email != "Ada@Example.com" || first.Reason != model.ReasonComplaint || first.Source.APIKey != "sk_live_abc" {
		t.Fatalf("Create stored %+v", first)
	}
	again, created, err := sups.Create(ctx, nl, model.NewSuppression{Email: "ada@example.COM", Reason: model.ReasonManual})
	if err != nil || created || again.ID != first.ID || again.Reason != model.ReasonComplaint {
		t.Fatalf("second Create = %+v, created %v, %v; want the first entry, not created", again, created, err)
	}
	got, err := sups.Get(ctx, nl, first.ID)
	if err != nil || got.ID != first.ID || !got.CreatedAt.Equal(first.CreatedAt) {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if _, err := sups.Get(ctx, uuid.Must(uuid.NewV7()), first.ID); !errors.Is(err, model.ErrSuppressionNotFound) {
		t.Fatalf("Get from another newsletter: %v, want ErrSuppressionNotFound", err)
	}
	if got, err := sups.Lookup(ctx, nl, "ADA@example.com"); err != nil || got.ID != first.ID {
		t.Fatalf("Lookup = %+v, %v", got, err)
	}
	if got, err := sups.LookupHash(ctx, nl, model.EmailHash("ada@example.com")); err != nil || got.ID != first.ID {
		t.Fatalf("LookupHash = %+v, %v", got, err)
	}
	if _, err := sups.Lookup(ctx, nl, "bob@example.com"); !errors.Is(err, model.ErrSuppressionNotFound) {
		t.Fatalf("Lookup of an address not suppressed: %v", err)
	}

	// An erased entry keeps the hash only, and is still found by the address.
	erased, isNew, err := sups.Suppress(ctx, nl, model.NewSuppression{Email: "Eve@example.com", Reason: model.ReasonErased,
		Source: model.SuppressionSource{Kind: model.SuppressionSourceErase}})
	if err != nil || !isNew || erased.Email != "" {
		t.Fatalf("Suppress erased = %+v, new %v, %v", erased, isNew, err)
	}
	if got, err := sups.Lookup(ctx, nl, "eve@EXAMPLE.com"); err != nil || got.ID != erased.ID || got.Reason != model.ReasonErased {
		t.Fatalf("Lookup of an erased address = %+v, %v", got, err)
	}
	var stored []byte
	if err := db.NewRaw("SELECT email_hash FROM suppressions WHERE id = ?", erased.ID).Scan(ctx, &stored); err != nil || !bytes.Equal(stored, model.EmailHash("eve@example.com")) {
		t.Fatalf("stored hash %x, %v", stored, err)
	}
	// Erasing an address suppressed for another reason leaves only its hash.
	if got, _, err := sups.Suppress(ctx, nl, model.NewSuppression{Email: "ada@example.com", Reason: model.ReasonErased,
		Source: model.SuppressionSource{Kind: model.SuppressionSourceErase}}); err != nil || got.ID != first.ID || got.Email != "" || got.Reason != model.ReasonErased {
		t.Fatalf("erasing a suppressed address = %+v, %v", got, err)
	}

	many, _, err := sups.CreateMany(ctx, nl, []model.NewSuppression{
		{Email: "c@example.com", Reason: model.ReasonManual}, {Email: "d@example.com", Reason: model.ReasonHardBounce}})
	if err != nil || len(many) != 2 {
		t.Fatalf("CreateMany = %v, %v", many, err)
	}
	page, more, err := sups.List(ctx, nl, model.SuppressionQuery{Limit: 2})
	if err != nil || !more || len(page) != 2 {
		t.Fatalf("List = %d entries, more %v, %v; want 2 and more", len(page), more, err)
	}
	rest, more, err := sups.List(ctx, nl, model.SuppressionQuery{Limit: 2,
		After: &model.Position{CreatedAt: page[1].CreatedAt, ID: page[1].ID}})
	if err != nil || more || len(rest) != 2 {
		t.Fatalf("List after = %d entries, more %v, %v; want 2, no more", len(rest), more, err)
	}
	seen := map[uuid.UUID]bool{}
	for _, s := range append(page, rest...) {
		seen[s.ID] = true
	}
	if len(seen) != 4 {
		t.Fatalf("two pages gave %d distinct entries, want 4", len(seen))
	}
	bounced, _, err := sups.List(ctx, nl, model.SuppressionQuery{Limit: 10, Reason: model.ReasonHardBounce})
	if err != nil || len(bounced) != 1 || bounced[0].Email != "d@example.com" {
		t.Fatalf("List by reason = %+v, %v", bounced, err)
	}
	byEmail, _, err := sups.List(ctx, nl, model.SuppressionQuery{Limit: 10, Email: "EVE@example.com"})
	if err != nil || len(byEmail) != 1 || byEmail[0].ID != erased.ID {
		t.Fatalf("List by an erased email = %+v, %v", byEmail, err)
	}

	// The check of other writes, in their transaction.
	err = db.InTx(ctx, func(tx repo.Tx) error {
		return tx.Suppressions().Check(ctx, nl, "new@example.com", " C@example.com", "eve@example.com")
	})
	var se *model.SuppressedError
	if !errors.As(err, &se) || len(se.Reasons) != 2 || se.Reasons[1] != model.ReasonManual || se.Reasons[2] != model.ReasonErased {
		t.Fatalf("CheckNotSuppressed = %v (%+v), want positions 1 and 2", err, se)
	}
	if err := db.InTx(ctx, func(tx repo.Tx) error {
		return tx.Suppressions().Check(ctx, nl, "new@example.com")
	}); err != nil {
		t.Fatalf("CheckNotSuppressed of a free address: %v", err)
	}

	deleted, err := sups.Delete(ctx, nl, many[0].ID)
	if err != nil || deleted.ID != many[0].ID || deleted.Email != "c@example.com" {
		t.Fatalf("Delete = %+v, %v", deleted, err)
	}
	if _, err := sups.Delete(ctx, nl, many[0].ID); !errors.Is(err, model.ErrSuppressionNotFound) {
		t.Fatalf("second Delete: %v, want ErrSuppressionNotFound", err)
	}
	if _, err := subs.Create(ctx, nl, model.NewSubscriber{Email: "c@example.com", Status: model.StatusActive}); err != nil {
		t.Fatalf("subscribing a no longer suppressed address: %v", err)
	}
}

// TestSuppressionUnsubscribes: suppressing the address of an active or pending subscriber
// unsubscribes it in the same transaction and cancels its unsent confirmation email.
func TestSuppressionUnsubscribes(t *testing.T) {
	db, sups, subs, nl := suppressionsDB(t)
	ctx := context.Background()
	sub, err := subs.Create(ctx, nl, model.NewSubscriber{Email: "Pat@example.com", Status: model.StatusPending})
	if err != nil {
		t.Fatal(err)
	}
	ctx = model.WithSource(ctx, model.APISource("sk_1"))
	if _, _, err := sups.Create(ctx, nl, model.NewSuppression{Email: "pat@EXAMPLE.com", Reason: model.ReasonComplaint,
		Source: model.SuppressionSource{Kind: model.SuppressionSourceAPI, APIKey: "sk_1"}}); err != nil {
		t.Fatal(err)
	}
	got, err := subs.Get(ctx, nl, sub.ID)
	if err != nil || got.Status != model.StatusUnsubscribed {
		t.Fatalf("subscriber after suppression: %+v, %v", got, err)
	}
	var states []string
	if err := db.NewRaw("SELECT state FROM email_outbox WHERE subscriber_id = ?", sub.ID).Scan(ctx, &states); err != nil {
		t.Fatal(err)
	}
	if len(states) != 1 || states[0] != "cancelled" {
		t.Fatalf("outbox states %v, want [cancelled]", states)
	}
	var payload string
	if err := db.NewRaw("SELECT payload FROM subscriber_events WHERE subscriber_id = ? AND type = ?", sub.ID, model.EventUnsubscribed).Scan(ctx, &payload); err != nil {
		t.Fatal(err)
	}
	if want := `"source":{"kind":"suppression","reason":"complaint","api_key":"sk_1"}`; !bytes.Contains([]byte(payload), []byte(want)) {
		t.Fatalf("event %s, want it to hold %s", payload, want)
	}
}

// TestCreateWaitsForASuppressionInFlight: a create of an address whose suppression is being
// committed meanwhile waits for the address's lock and then sees the suppression (§13), on
// both engines. On PostgreSQL the create is one statement, whose own snapshot predates the
// wait: it must read the list after the lock all the same.
func TestCreateWaitsForASuppressionInFlight(t *testing.T) {
	db, _, subs, nl := suppressionsDB(t)
	createWaitsForSuppression(t, db, subs, nl)
}

// TestCreateUnderRepeatableReadDefault: on a database whose default isolation is REPEATABLE
// READ, the pool still runs READ COMMITTED (Open pins it on every connection), so the
// one-statement create still sees a suppression committed while it waited for the lock.
func TestCreateUnderRepeatableReadDefault(t *testing.T) {
	if testdb.Store() == testdb.SQLite {
		t.Skip("PostgreSQL only: SQLite has one isolation level (serializable)")
	}
	dsn := pg.Fresh(t)
	ctx := context.Background()
	admin, err := repo.Open(dsn, repo.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ExecContext(ctx, `DO $$ BEGIN
EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = ''repeatable read''', current_database());
END $$`); err != nil {
		t.Fatal(err)
	}
	var setting string
	if err := admin.NewRaw(`SELECT array_to_string(setconfig, ',') FROM pg_db_role_setting
WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database()) AND setrole = 0`).Scan(ctx, &setting); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	if setting != "default_transaction_isolation=repeatable read" {
		t.Fatalf("the database's settings are %q; want repeatable read by default", setting)
	}
	db, err := repo.Open(dsn, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var level string
	if err := db.InTx(ctx, func(tx repo.Tx) error {
		return tx.IDB().NewRaw("SHOW transaction_isolation").Scan(ctx, &level)
	}); err != nil || level != "read committed" {
		t.Fatalf("a transaction of the pool runs %q (%v); want read committed", level, err)
	}
	nl, err := repo.NewAccounts(db).CreateNewsletter(ctx, "Weekly", true)
	if err != nil {
		t.Fatal(err)
	}
	createWaitsForSuppression(t, db, repo.NewSubscribers(db), nl.ID)
}

// createWaitsForSuppression checks that a create of an address whose suppression commits while
// the create waits for the address's lock is refused as suppressed, and stores nothing.
func createWaitsForSuppression(t *testing.T, db *repo.DB, subs *repo.Subscribers, nl uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	for _, status := range []model.Status{model.StatusActive, model.StatusPending} {
		email := "late-" + string(status) + "@example.com"
		held, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		go func() {
			done <- db.InTx(ctx, func(tx repo.Tx) error {
				if _, _, err := tx.Suppressions().Suppress(ctx, nl, model.NewSuppression{Email: email, Reason: model.ReasonManual,
					Source: model.SuppressionSource{Kind: model.SuppressionSourceAPI, APIKey: "sk_1"}}); err != nil {
					return err
				}
				close(held)
				<-release
				return nil
			})
		}()
		<-held
		created := make(chan error, 1)
		go func() {
			_, err := subs.Create(ctx, nl, model.NewSubscriber{Email: email, Status: status})
			created <- err
		}()
		select {
		case err := <-created:
			t.Fatalf("%s: the create finished while the suppression held the address: %v", status, err)
		case <-time.After(300 * time.Millisecond):
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		var supp *model.SuppressedError
		if err := <-created; !errors.As(err, &supp) || supp.Reasons[0] != model.ReasonManual {
			t.Fatalf("%s: create after the suppression committed: %v, want it suppressed (manual)", status, err)
		}
		var n int
		if err := db.NewRaw("SELECT count(*) FROM subscribers WHERE email_key = ?", email).Scan(ctx, &n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("%s: %d subscribers of the suppressed address", status, n)
		}
	}
}
