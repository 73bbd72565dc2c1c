package repo_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// A prepared statement makes the span bun's query hook made for the same statement: the same
// name, kind and attributes, with its own text (placeholders, no value) as db.query.text; a
// failure marks it failed with the SQLSTATE as error.type, a missing row does not.
func TestPreparedStatementSpans(t *testing.T) {
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: SQLite keeps bun's statements")
	}
	dsn := pg.Fresh(t)
	db, err := repo.Open(dsn, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	repo.TraceQueries(db, tp)
	ctx, _ := tp.Tracer("test").Start(context.Background(), "request")
	accounts, subs := repo.NewAccounts(db), repo.NewSubscribers(db)
	nl, err := accounts.CreateNewsletter(context.Background(), "spans", true)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := subs.Create(context.Background(), nl.ID, model.NewSubscriber{Email: "ada@example.com", Status: model.StatusActive})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := subs.Get(ctx, nl.ID, sub.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := subs.Get(ctx, nl.ID, uuid.Must(uuid.NewV7())); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("get of a missing subscriber: %v, want model.ErrNotFound", err)
	}
	// A failing statement: the table is gone (42P01).
	if _, err := db.ExecContext(context.Background(), "ALTER TABLE subscribers RENAME TO gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := subs.Get(ctx, nl.ID, sub.ID); err == nil {
		t.Fatal("get from a missing table succeeded")
	}

	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3 (found, not found, failed)", len(spans))
	}
	dbName := dsn[strings.LastIndex(dsn, "/")+1:]
	dbName, _, _ = strings.Cut(dbName, "?")
	for i, s := range spans {
		a := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			a[kv.Key] = kv.Value
		}
		if s.Name() != "SELECT subscribers" || s.SpanKind() != trace.SpanKindClient {
			t.Errorf("span %d: %q, kind %v; want SELECT subscribers, client", i, s.Name(), s.SpanKind())
		}
		for k, want := range map[attribute.Key]string{
			"db.system.name": "postgresql", "db.namespace": dbName, "server.address": "127.0.0.1",
			"db.operation.name": "SELECT", "db.collection.name": "subscribers", "db.query.text": repo.GetSubscriberText,
		} {
			if got := a[k].AsString(); got != want {
				t.Errorf("span %d: %s = %q, want %q", i, k, got, want)
			}
		}
		failed := i == 2
		if got := s.Status().Code == codes.Error; got != failed {
			t.Errorf("span %d: status %v, want failed %v", i, s.Status(), failed)
		}
		if got := a["error.type"].AsString(); failed && got != "42P01" || !failed && got != "" {
			t.Errorf("span %d: error.type %q", i, got)
		}
	}
}

// PostgreSQL parses and plans a prepared statement once per connection, however often it runs;
// a statement whose prepare failed is prepared again on the next call rather than failing for
// good.
func TestPreparedOncePerConnection(t *testing.T) {
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: SQLite keeps bun's statements")
	}
	ctx := context.Background()
	dsn := pg.Empty(t)
	if _, err := repo.EnsureDatabase(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	db, err := repo.Open(dsn, repo.Options{MaxConns: 1}) // every statement on one connection
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	subs := repo.NewSubscribers(db)
	nl, id := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	// No table yet: the prepare fails.
	if _, err := subs.Get(ctx, nl, id); err == nil || errors.Is(err, model.ErrNotFound) {
		t.Fatalf("get before the migrations: %v, want the prepare's failure", err)
	}
	if _, err := repo.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	for range 8 {
		if _, err := subs.Get(ctx, nl, id); !errors.Is(err, model.ErrNotFound) {
			t.Fatalf("get after the migrations: %v, want model.ErrNotFound", err)
		}
	}
	var prepared, plans int
	if err := db.NewRaw("SELECT count(*), coalesce(sum(generic_plans + custom_plans), 0) FROM pg_prepared_statements WHERE statement = ?",
		repo.GetSubscriberText).Scan(ctx, &prepared, &plans); err != nil {
		t.Fatal(err)
	}
	if prepared != 1 || plans != 8 {
		t.Errorf("the connection holds the statement prepared %d times, run %d times; want 1 and 8", prepared, plans)
	}
}

// A statement never prepared on the pool yet, run in units of work that hold every connection
// of the pool, runs at once: it is prepared on each transaction's own connection, never on a
// second one that no unit of work would give back.
func TestFirstPrepareInsideEveryConnectionsTransaction(t *testing.T) {
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: SQLite's statements are bun's")
	}
	db, err := repo.Open(pg.Fresh(t), repo.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var begun sync.WaitGroup
	begun.Add(2)
	errs := make(chan error, 2)
	for i := range 2 {
		go func() {
			errs <- db.InTx(ctx, func(tx repo.Tx) error {
				begun.Done()
				begun.Wait() // both connections are now in a transaction
				var got []int64
				if err := repo.QueryRowsTx(ctx, tx, "SELECT $1::bigint AS n", &got, i); err != nil {
					return err
				}
				if len(got) != 1 || got[0] != int64(i) {
					return fmt.Errorf("got %v, want [%d]", got, i)
				}
				return nil
			})
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("a first prepare inside a transaction, with every connection in one: %v", err)
		}
	}
}
