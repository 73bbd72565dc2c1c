package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/internal/testredis"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/webhook"
)

var pg *testdb.Server

func TestMain(m *testing.M) {
	if os.Getenv(importWorkerProcessEnv) != "" {
		os.Exit(runImportWorkerProcess()) // an import worker process (imports_test.go)
	}
	if os.Getenv(bulkWorkerProcessEnv) != "" {
		os.Exit(runBulkWorkerProcess()) // a bulk action worker process (bulkactions_test.go)
	}
	if os.Getenv(workerProcessEnv) != "" {
		os.Exit(runWorkerProcess()) // this binary started as a worker process (crash_test.go)
	}
	code := testdb.Main(m, &pg)
	testredis.Stop()
	// The answers the tests received, against the document (traffic_test.go).
	if problems := checkTraffic(); len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the servers sent %d answers the OpenAPI document does not declare "+
			"(declare them in package api: api/codes.go, the response types):\n  %s\n", len(problems), strings.Join(problems, "\n  "))
		code = max(code, 1)
	} else if n := trafficSummary(); n > 0 && testing.Verbose() {
		fmt.Fprintf(os.Stderr, "traffic: %d kinds of answer, all declared by the OpenAPI document, bodies included\n", n)
	}
	os.Exit(code)
}

// freshDatabase clones the migrated template into a new database, dropped when t ends.
func freshDatabase(t testing.TB) string { return pg.Fresh(t) }

// postgresOnly skips a test that cannot mean anything on the store under test, saying why. The
// suite runs on PostgreSQL and SQLite (TEST_STORE); keep this for what is inherently
// PostgreSQL's.
func postgresOnly(t testing.TB, why string) {
	t.Helper()
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: " + why)
	}
}

// noOutageOnSQLite is why the outage tests are PostgreSQL's: they cut a TCP proxy between the
// service and its database server.
const noOutageOnSQLite = "an outage is simulated by cutting the TCP connection to the database server; the SQLite store is a file inside the process, with no connection to lose"

// env is one service instance on its own database, with one newsletter and key.
type env struct {
	t        *testing.T
	dsn      string
	db       *repo.DB
	accounts *repo.Accounts
	idem     *repo.Idempotency
	srv      *httptest.Server
	base     string // …/api/v1
	nl       uuid.UUID
	key      string
}

type envOptions struct {
	dsn              string // use this database instead of a fresh one
	keyCacheTTL      time.Duration
	statementTimeout time.Duration
	limiter          api.Limiter    // nil: no limits
	trusted          []netip.Prefix // TRUSTED_PROXIES
	guardPrivate     bool           // refuse private webhook URLs (WEBHOOK_ALLOW_PRIVATE unset)
	idempotencyTTL   time.Duration  // 0: 24 h
	queryHook        bun.QueryHook  // added to the service's pool, to watch its statements
	importMaxRows    int64          // 0: IMPORT_MAX_ROWS's default
	importMaxBytes   int64          // 0: IMPORT_MAX_BYTES's default
}

func newEnv(t *testing.T, opts ...func(*envOptions)) *env {
	t.Helper()
	var o envOptions
	for _, f := range opts {
		f(&o)
	}
	dsn := o.dsn
	if dsn == "" {
		dsn = freshDatabase(t)
	}
	db, err := repo.Open(dsn, repo.Options{StatementTimeout: o.statementTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if o.queryHook != nil {
		db.AddQueryHook(o.queryHook)
	}
	e := &env{t: t, dsn: dsn, db: db, accounts: repo.NewAccounts(db)}
	ttl := o.idempotencyTTL
	if ttl == 0 {
		ttl = 24 * time.Hour
	}
	e.idem = repo.NewIdempotency(db, ttl)
	cursorKey, err := repo.Secret(context.Background(), db, "cursor")
	if err != nil {
		t.Fatal(err)
	}
	nonceKey, err := repo.Secret(context.Background(), db, "page_nonce")
	if err != nil {
		t.Fatal(err)
	}
	srv := api.New(api.Config{
		Store:          repo.NewSubscribers(db),
		Auth:           e.accounts,
		KeyCacheTTL:    o.keyCacheTTL,
		Limiter:        o.limiter,
		TrustedProxies: o.trusted,
		Events:         repo.NewEvents(db),
		Privacy:        repo.NewPrivacy(db),
		Webhooks:       repo.NewWebhooks(db),
		Suppressions:   repo.NewSuppressions(db),
		Segments:       repo.NewSegments(db),
		WebhookGuard:   webhook.Guard{AllowPrivate: !o.guardPrivate},
		Idempotency:    api.IdempotencyOf(e.idem),
		CursorKey:      cursorKey,
		PageNonceKey:   nonceKey,
		Imports:        repo.NewImports(db),
		ImportMaxRows:  o.importMaxRows,
		ImportMaxBytes: o.importMaxBytes,
		BulkActions:    repo.NewBulkActions(db),
		// As cmd/subscriberd sets it: 8 bulk creates at once on PostgreSQL, 4 on SQLite.
		BulkConcurrency:  api.BulkConcurrency(db.DB.Stats().MaxOpenConnections),
		WriteConcurrency: api.WriteConcurrency(db.DB.Stats().MaxOpenConnections),
	})
	e.srv = httptest.NewServer(recordTraffic(srv))
	t.Cleanup(e.srv.Close)
	e.base = e.srv.URL + api.BasePath
	e.nl, e.key = e.newKey(t, true)
	return e
}

// newKey makes a newsletter and a key for it.
func (e *env) newKey(t *testing.T, apiAccess bool) (uuid.UUID, string) {
	t.Helper()
	ctx := context.Background()
	nl, err := e.accounts.CreateNewsletter(ctx, "Newsletter "+t.Name(), apiAccess)
	if err != nil {
		t.Fatal(err)
	}
	_, key, err := e.accounts.CreateKey(ctx, nl.ID, "test")
	if err != nil {
		t.Fatal(err)
	}
	return nl.ID, key
}

type response struct {
	status int
	header http.Header
	raw    []byte
	body   map[string]any
}

// do sends a request with the env's key. body: nil (none), string or []byte (raw), or any
// value (JSON). headers are "Name: value"; "Name:" with no value removes a default header.
func (e *env) do(method, path string, body any, headers ...string) response {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		js, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(js)
	}
	target := path
	if !strings.HasPrefix(path, "http") {
		target = e.base + path
	}
	req, err := http.NewRequest(method, target, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		if v = strings.TrimSpace(v); v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	r := response{status: res.StatusCode, header: res.Header, raw: raw}
	if len(raw) > 0 && strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			e.t.Fatalf("%s %s: body is not a JSON object: %v: %s", method, path, err, raw)
		}
	}
	return r
}

// want fails the test unless the response has the status (and, for errors, the code).
func (r response) want(t *testing.T, status int, code string) response {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body %s", r.status, status, r.raw)
	}
	if _, ok := r.body["success"].(bool); !ok {
		t.Fatalf("body has no boolean success: %s", r.raw)
	}
	if code != "" && r.body["code"] != code {
		t.Fatalf("code = %v, want %s; body %s", r.body["code"], code, r.raw)
	}
	return r
}

// data is the response's data object.
func (r response) data(t *testing.T) map[string]any {
	t.Helper()
	d, ok := r.body["data"].(map[string]any)
	if !ok {
		t.Fatalf("no data object in %s", r.raw)
	}
	return d
}

// fieldErrors is the errors object of a 422.
func (r response) fieldErrors(t *testing.T) map[string][]string {
	t.Helper()
	raw, ok := r.body["errors"].(map[string]any)
	if !ok {
		t.Fatalf("no errors object in %s", r.raw)
	}
	out := map[string][]string{}
	for k, v := range raw {
		list, ok := v.([]any)
		if !ok {
			t.Fatalf("errors.%s is not an array: %s", k, r.raw)
		}
		for _, m := range list {
			out[k] = append(out[k], m.(string))
		}
	}
	return out
}

// count returns a number from SQL against the env's database.
func (e *env) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.db.NewRaw(query, args...).Scan(context.Background(), &n); err != nil {
		e.t.Fatal(err)
	}
	return n
}
