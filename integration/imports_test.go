package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/subscriberd/subscriberd/importer"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
)

// startImporter runs the import workers on the env's database until t ends, as serve does,
// with a short poll so that tests do not wait.
func (e *env) startImporter(t *testing.T, cfg importer.Config) {
	t.Helper()
	cfg.Interval = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	w := importer.NewWorker(repo.NewImports(e.db), cfg)
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }() //nolint:errcheck // nil
	t.Cleanup(func() { cancel(); <-done })
}

// upload sends body as an import file of content type ct, with query q.
func (e *env) upload(ct, body, q string) response {
	e.t.Helper()
	path := "/imports"
	if q != "" {
		path += "?" + q
	}
	return e.do(http.MethodPost, path, body, "Content-Type: "+ct)
}

// waitImport polls the import at loc until its state is want, and returns it.
func (e *env) waitImport(t *testing.T, loc, want string) map[string]any {
	t.Helper()
	// Generous: under the race detector on a busy 2-core machine a few thousand rows took
	// more than 20 s on SQLite. The wait ends as soon as the import does.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		d := e.do(http.MethodGet, strings.TrimPrefix(loc, "/api/v1"), nil).want(t, http.StatusOK, "").data(t)
		if d["state"] == want {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("import %s is %v, want %s: %v", loc, d["state"], want, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func wantCounts(t *testing.T, imp map[string]any, want map[string]float64) {
	t.Helper()
	got, _ := imp["counts"].(map[string]any)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("counts.%s = %v, want %v (counts %v)", k, got[k], v, got)
		}
	}
}

// TestImportCSV: a CSV file with a byte order mark, its columns in any order and one ignored,
// quoted fields; every row's outcome (§15): created, existing (in the newsletter, or earlier
// in the file), invalid with its errors kept; the existing subscriber is not changed in any
// way; a pending row gets its confirmation email and every created row its event.
func TestImportCSV(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.do(http.MethodPost, "/subscribers", map[string]any{"email": "old@example.com", "name": "Old Name", "status": "pending"}).
		want(t, http.StatusCreated, "")
	old := e.do(http.MethodGet, "/subscribers?email=old@example.com", nil).want(t, http.StatusOK, "").raw
	e.startImporter(t, importer.Config{BatchSize: 2})

	file := "\ufeffNAME,extra,Email,status\r\n" +
		"\"Doe, John\",x,john@example.com,\r\n" + // 1 created, active (the default)
		"Someone,x,OLD@example.com,active\r\n" + // 2 existing: nothing changes
		"Again,x,JOHN@example.com,pending\r\n" + // 3 existing: earlier in the file
		"Bad,x,not-an-email,\r\n" + // 4 invalid
		"Pat,x,pat@example.com,pending\r\n" + // 5 created, pending
		"Zed,x,zed@example.com,unsubscribed\r\n" // 6 invalid status
	res := e.upload("text/csv; charset=utf-8", file, "").want(t, http.StatusAccepted, "")
	d := res.data(t)
	loc := res.header.Get("Location")
	if loc != "/api/v1/imports/"+d["id"].(string) {
		t.Fatalf("Location = %q for import %v", loc, d["id"])
	}
	if d["format"] != "csv" || d["default_status"] != "active" || d["state"] != "queued" {
		t.Errorf("new import = %v", d)
	}
	wantCounts(t, d, map[string]float64{"rows": 6, "processed": 0})

	imp := e.waitImport(t, loc, "completed")
	wantCounts(t, imp, map[string]float64{"rows": 6, "processed": 6, "created": 2, "existing": 2, "suppressed": 0, "invalid": 2})
	if imp["started_at"] == nil || imp["finished_at"] == nil {
		t.Errorf("finished import without times: %v", imp)
	}

	john := e.do(http.MethodGet, "/subscribers?email=john@example.com", nil).want(t, http.StatusOK, "").body["data"].([]any)
	if len(john) != 1 || john[0].(map[string]any)["name"] != "Doe, John" || john[0].(map[string]any)["status"] != "active" {
		t.Errorf("john = %v", john)
	}
	pat := e.do(http.MethodGet, "/subscribers?email=pat@example.com", nil).want(t, http.StatusOK, "").body["data"].([]any)
	if len(pat) != 1 || pat[0].(map[string]any)["status"] != "pending" {
		t.Fatalf("pat = %v", pat)
	}
	if got := e.do(http.MethodGet, "/subscribers?email=old@example.com", nil).raw; string(got) != string(old) {
		t.Errorf("the existing subscriber changed:\n%s\nwas\n%s", got, old)
	}
	if n := e.count("SELECT count(*) FROM subscriber_events e JOIN subscribers s ON s.id = e.subscriber_id WHERE s.email_key = 'old@example.com'"); n != 1 {
		t.Errorf("the existing subscriber has %d events, want its 1", n)
	}
	if n := e.count("SELECT count(*) FROM email_outbox o JOIN subscribers s ON s.id = o.subscriber_id WHERE s.email_key = 'pat@example.com'"); n != 1 {
		t.Errorf("pat has %d confirmation emails queued, want 1", n)
	}
	if n := e.count("SELECT count(*) FROM email_outbox o JOIN subscribers s ON s.id = o.subscriber_id WHERE s.email_key = 'old@example.com'"); n != 1 {
		t.Errorf("the existing pending subscriber has %d emails, want its 1", n)
	}
	patID := pat[0].(map[string]any)["id"].(string)
	evs := e.do(http.MethodGet, "/subscribers/"+patID+"/events", nil).want(t, http.StatusOK, "").body["data"].([]any)
	if len(evs) != 1 {
		t.Fatalf("pat's events = %v", evs)
	}
	ev := evs[0].(map[string]any)
	src := ev["data"].(map[string]any)["source"].(map[string]any)
	if ev["type"] != "subscriber.created" || src["kind"] != "api" || !strings.HasPrefix(e.key, src["api_key"].(string)) {
		t.Errorf("pat's event = %v", ev)
	}
	if n := e.count("SELECT count(*) FROM import_rows"); n != 0 {
		t.Errorf("%d staged rows left after the import completed", n)
	}

	errs := e.do(http.MethodGet, strings.TrimPrefix(loc, "/api/v1")+"/errors?limit=1", nil).want(t, http.StatusOK, "")
	page := errs.body["data"].([]any)
	if len(page) != 1 || page[0].(map[string]any)["row"] != 4.0 {
		t.Fatalf("first error page = %s", errs.raw)
	}
	if got := page[0].(map[string]any)["errors"].(map[string]any)["email"]; fmt.Sprint(got) != "[The email field must be a valid email address.]" {
		t.Errorf("row 4 errors = %v", got)
	}
	next := errs.body["pagination"].(map[string]any)["next_cursor"].(string)
	errs = e.do(http.MethodGet, strings.TrimPrefix(loc, "/api/v1")+"/errors?limit=1&cursor="+url.QueryEscape(next), nil).want(t, http.StatusOK, "")
	page = errs.body["data"].([]any)
	if len(page) != 1 || page[0].(map[string]any)["row"] != 6.0 || errs.body["pagination"].(map[string]any)["next_cursor"] != nil {
		t.Fatalf("second error page = %s", errs.raw)
	}
	if _, ok := page[0].(map[string]any)["errors"].(map[string]any)["status"]; !ok {
		t.Errorf("row 6 errors = %s", errs.raw)
	}
}

// TestImportNDJSON: one §3 input object per line, blank lines skipped, query status=pending
// for rows that give none; properties other than email, name and status, and wrong types,
// are row errors.
func TestImportNDJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startImporter(t, importer.Config{})
	file := `{"email":"a@example.com","name":"Ann"}` + "\n\n" +
		`{"email":"b@example.com","status":"active"}` + "\n" +
		`{"email":"c@example.com","colour":"red"}` + "\n" +
		`{"email":5}` + "\n"
	res := e.upload("application/x-ndjson", file, "status=pending").want(t, http.StatusAccepted, "")
	imp := e.waitImport(t, res.header.Get("Location"), "completed")
	if imp["format"] != "ndjson" || imp["default_status"] != "pending" {
		t.Errorf("import = %v", imp)
	}
	wantCounts(t, imp, map[string]float64{"rows": 4, "processed": 4, "created": 2, "invalid": 2})
	for email, status := range map[string]string{"a@example.com": "pending", "b@example.com": "active"} {
		got := e.do(http.MethodGet, "/subscribers?email="+email, nil).want(t, http.StatusOK, "").body["data"].([]any)
		if len(got) != 1 || got[0].(map[string]any)["status"] != status {
			t.Errorf("%s = %v, want %s", email, got, status)
		}
	}
	errs := e.do(http.MethodGet, strings.TrimPrefix(res.header.Get("Location"), "/api/v1")+"/errors", nil).want(t, http.StatusOK, "")
	want := `[{"errors":{"colour":["The colour field is prohibited."]},"row":3},{"errors":{"email":["The email field must be a string."]},"row":4}]`
	got, _ := json.Marshal(errs.body["data"])
	if string(got) != want {
		t.Errorf("errors = %s\nwant %s", got, want)
	}
}

// TestImportBadFiles: a file that cannot be read is refused at once with a 400 naming the
// line, another media type with 415; none leaves an import behind.
func TestImportBadFiles(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, tc := range []struct {
		name, ct, body, query string
		status                int
		msg                   string
	}{
		{"no email column", "text/csv", "name,status\nJohn,active\n", "", 400, "The CSV header (line 1) has no email column."},
		{"empty", "text/csv", "", "", 400, "The file is empty: a CSV file starts with a header row naming an email column (line 1)."},
		{"broken quoting", "text/csv", "email,name\na@example.com,ok\nb@example.com,\"open\n", "", 400, "line 3"},
		{"bare quote", "text/csv", "email,name\na@example.com,Jo\"hn\n", "", 400, "line 2"},
		{"not UTF-8", "text/csv", "email,name\na@example.com,ok\nb@example.com,\xff\xfe\n", "", 400, "The file is not valid UTF-8: line 3."},
		{"ndjson not an object", "application/x-ndjson", "{\"email\":\"a@example.com\"}\n[1]\n", "", 400, "Line 2 is not a JSON object."},
		{"ndjson not JSON", "application/x-ndjson", "{\"email\":\"a@example.com\"\n", "", 400, "Line 1 is not a JSON object."},
		{"ndjson not UTF-8", "application/x-ndjson", "{\"email\":\"\xff@example.com\"}\n", "", 400, "The file is not valid UTF-8: line 1."},
		{"media type", "application/json", "[]", "", 415, "The request body must be sent as text/csv or application/x-ndjson."},
		{"status", "text/csv", "email\na@example.com\n", "status=unsubscribed", 400, "The status parameter must be active or pending."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := e.upload(tc.ct, tc.body, tc.query).want(t, tc.status, "")
			if msg, _ := res.body["message"].(string); !strings.Contains(msg, tc.msg) {
				t.Errorf("message = %q, want it to contain %q", msg, tc.msg)
			}
			if _, ok := res.body["errors"]; ok {
				t.Errorf("errors member on a %d: %s", tc.status, res.raw)
			}
		})
	}
	if n := e.count("SELECT count(*) FROM imports"); n != 0 {
		t.Errorf("%d imports left by refused uploads", n)
	}
	if n := e.count("SELECT count(*) FROM import_rows"); n != 0 {
		t.Errorf("%d staged rows left by refused uploads", n)
	}
}

// TestImportLimits: over IMPORT_MAX_ROWS or IMPORT_MAX_BYTES → 413, whether the size is
// declared or found while reading; the 1 MiB limit of other bodies does not apply.
func TestImportLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(o *envOptions) { o.importMaxRows = 3; o.importMaxBytes = 2 << 20 })
	rows := "email\na@example.com\nb@example.com\nc@example.com\nd@example.com\n"
	res := e.upload("text/csv", rows, "").want(t, http.StatusRequestEntityTooLarge, "payload_too_large")
	if res.body["message"] != "An import file must not have more than 3 rows." {
		t.Errorf("message = %v", res.body["message"])
	}
	// 1.5 MiB of one row: over the 1 MiB of other bodies, under this limit.
	big := "email,name\na@example.com," + strings.Repeat("x", 1<<20+1<<19) + "\n"
	e.upload("text/csv", big, "").want(t, http.StatusAccepted, "")
	// Over 2 MiB, declared: refused before the body is read.
	huge := "email,name\n" + strings.Repeat("a@example.com,x\n", (2<<20)/16+10)
	res = e.upload("text/csv", huge, "").want(t, http.StatusRequestEntityTooLarge, "payload_too_large")
	if res.body["message"] != "An import file must not be larger than 2 MiB." {
		t.Errorf("message = %v", res.body["message"])
	}
	// Over 2 MiB, not declared (chunked): found while reading.
	req, _ := http.NewRequest(http.MethodPost, e.base+"/imports", struct{ *strings.Reader }{strings.NewReader(huge)})
	req.Header.Set("Authorization", "Bearer "+e.key)
	req.Header.Set("Content-Type", "text/csv")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("chunked upload over the limit: %d", resp.StatusCode)
	}
	if n := e.count("SELECT count(*) FROM imports"); n != 1 {
		t.Errorf("%d imports, want the 1 accepted", n)
	}
}

// TestImportClientHangsUp: a client that goes away in the middle of its upload leaves no
// import and no staged row behind.
func TestImportClientHangsUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	part := "email,name\n" + strings.Repeat("someone@example.com,Some One\n", 20000)
	fmt.Fprintf(conn, "POST /api/v1/imports HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: text/csv\r\nContent-Length: %d\r\n\r\n%s",
		e.key, len(part)*2, part)
	time.Sleep(300 * time.Millisecond) // the rows so far are being stored
	conn.Close()
	// The server stores what it has read before it meets the end of the body: 20,000 rows,
	// which take seconds on SQLite under the race detector.
	deadline := time.Now().Add(30 * time.Second)
	for {
		imports, rows := e.count("SELECT count(*) FROM imports"), e.count("SELECT count(*) FROM import_rows")
		if imports == 0 && rows == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d imports and %d staged rows left by a client that hung up", imports, rows)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// And it stays so: nothing commits later.
	time.Sleep(300 * time.Millisecond)
	if n := e.count("SELECT count(*) FROM imports"); n != 0 {
		t.Fatalf("%d imports appeared after the hang-up", n)
	}
}

// TestImportCancelListGet: a queued import cancels (200, cancelled); cancelling it again, or
// a completed one, is 409 import_finished; unknown ids are 404; the list is newest first with
// a cursor, and another newsletter's imports are not found.
func TestImportCancelListGet(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var locs []string
	for i := range 3 {
		res := e.upload("text/csv", fmt.Sprintf("email\nu%d@example.com\n", i), "").want(t, http.StatusAccepted, "")
		locs = append(locs, strings.TrimPrefix(res.header.Get("Location"), "/api/v1"))
	}
	res := e.do(http.MethodDelete, locs[0], nil).want(t, http.StatusOK, "")
	if d := res.data(t); d["state"] != "cancelled" || d["finished_at"] == nil {
		t.Errorf("cancelled import = %v", d)
	}
	res = e.do(http.MethodDelete, locs[0], nil).want(t, http.StatusConflict, "import_finished")
	if res.body["message"] != "This import has already finished." {
		t.Errorf("409 message = %v", res.body["message"])
	}
	e.do(http.MethodGet, "/imports/"+uuid.NewString(), nil).want(t, http.StatusNotFound, "not_found")
	e.do(http.MethodGet, "/imports/nope", nil).want(t, http.StatusNotFound, "not_found")
	e.do(http.MethodDelete, "/imports/"+uuid.NewString(), nil).want(t, http.StatusNotFound, "not_found")
	e.do(http.MethodGet, "/imports/"+uuid.NewString()+"/errors", nil).want(t, http.StatusNotFound, "not_found")

	list := e.do(http.MethodGet, "/imports?limit=2", nil).want(t, http.StatusOK, "")
	data := list.body["data"].([]any)
	if len(data) != 2 || "/imports/"+data[0].(map[string]any)["id"].(string) != locs[2] {
		t.Fatalf("first page = %s", list.raw)
	}
	next := list.body["pagination"].(map[string]any)["next_cursor"].(string)
	list = e.do(http.MethodGet, "/imports?limit=2&cursor="+url.QueryEscape(next), nil).want(t, http.StatusOK, "")
	data = list.body["data"].([]any)
	if len(data) != 1 || "/imports/"+data[0].(map[string]any)["id"].(string) != locs[0] || list.body["pagination"].(map[string]any)["next_cursor"] != nil {
		t.Fatalf("second page = %s", list.raw)
	}
	e.do(http.MethodGet, "/imports?cursor=bogus", nil).want(t, http.StatusBadRequest, "validation_error")

	// Another newsletter's key sees none of them.
	_, other := e.newKey(t, true)
	own := e.key
	e.key = other
	e.do(http.MethodGet, locs[1], nil).want(t, http.StatusNotFound, "not_found")
	if d := e.do(http.MethodGet, "/imports", nil).want(t, http.StatusOK, "").body["data"].([]any); len(d) != 0 {
		t.Errorf("another newsletter lists %v", d)
	}
	e.key = own

	e.startImporter(t, importer.Config{})
	e.waitImport(t, "/api/v1"+locs[2], "completed")
	e.do(http.MethodDelete, locs[2], nil).want(t, http.StatusConflict, "import_finished")
	if n := e.count("SELECT count(*) FROM subscribers WHERE email_key = 'u0@example.com'"); n != 0 {
		t.Errorf("the cancelled import created its row")
	}
}

// TestImportResumeAfterLostWorker: a worker that stops after some batches without giving its
// import back (a crash) is replaced once its lease runs out; the import resumes after the
// last committed batch: every row is counted once and every address created once. The first
// worker's later batch commits nothing.
func TestImportResumeAfterLostWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var b strings.Builder
	b.WriteString("email\n")
	for i := range 25 {
		fmt.Fprintf(&b, "r%02d@example.com\n", i)
	}
	loc := e.upload("text/csv", b.String(), "").want(t, http.StatusAccepted, "").header.Get("Location")
	store := repo.NewImports(e.db)
	ctx := context.Background()
	const lease = 200 * time.Millisecond
	job, ok, err := store.Claim(ctx, lease)
	if err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	if _, ok, _ := store.Claim(ctx, lease); ok {
		t.Fatal("a second worker claimed the running import")
	}
	for range 2 {
		if _, done, err := store.Batch(ctx, job, 5, lease); err != nil || done {
			t.Fatalf("batch: %v %v", done, err)
		}
	}
	time.Sleep(2 * lease) // the worker "crashed": its lease runs out
	job2, ok, err := store.Claim(ctx, lease)
	if err != nil || !ok || job2.ID != job.ID || job2.Counts.Processed != 10 {
		t.Fatalf("takeover: %v %v %+v", ok, err, job2)
	}
	if _, _, err := store.Batch(ctx, job, 5, lease); err == nil {
		t.Fatal("the lost worker's batch committed")
	}
	e.startImporter(t, importer.Config{BatchSize: 5})
	store.Release(ctx, job2) //nolint:errcheck // handed to the running workers
	imp := e.waitImport(t, loc, "completed")
	wantCounts(t, imp, map[string]float64{"rows": 25, "processed": 25, "created": 25, "existing": 0})
	if n := e.count("SELECT count(*) FROM subscribers"); n != 25 {
		t.Errorf("%d subscribers, want 25", n)
	}
	if n := e.count("SELECT count(*) FROM subscriber_events"); n != 25 {
		t.Errorf("%d events, want 25", n)
	}
}

// TestImportOneRunningPerNewsletter: while a newsletter's import runs, its next one waits;
// another newsletter's goes ahead. Two imports of the same file create every address once.
func TestImportOneRunningPerNewsletter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	file := "email\nx@example.com\ny@example.com\n"
	first := e.upload("text/csv", file, "").want(t, http.StatusAccepted, "").header.Get("Location")
	second := e.upload("text/csv", file, "").want(t, http.StatusAccepted, "").header.Get("Location")
	_, otherKey := e.newKey(t, true)
	own := e.key
	e.key = otherKey
	third := e.upload("text/csv", file, "").want(t, http.StatusAccepted, "").header.Get("Location")
	e.key = own

	store := repo.NewImports(e.db)
	ctx := context.Background()
	a, ok, err := store.Claim(ctx, time.Minute)
	if err != nil || !ok || "/api/v1/imports/"+a.ID.String() != first {
		t.Fatalf("first claim: %v %v %v", ok, err, a.ID)
	}
	b, ok, err := store.Claim(ctx, time.Minute)
	if err != nil || !ok || "/api/v1/imports/"+b.ID.String() != third {
		t.Fatalf("second claim took %v (%v %v), want the other newsletter's %s", b.ID, ok, err, third)
	}
	if _, ok, _ := store.Claim(ctx, time.Minute); ok {
		t.Fatal("a newsletter's second import started while its first runs")
	}
	for _, j := range []model.ImportJob{a, b} {
		if _, done, err := store.Batch(ctx, j, 10, time.Minute); err != nil || !done {
			t.Fatalf("batch: %v %v", done, err)
		}
	}
	e.startImporter(t, importer.Config{})
	imp := e.waitImport(t, second, "completed")
	wantCounts(t, imp, map[string]float64{"created": 0, "existing": 2})
	e.key = otherKey
	wantCounts(t, e.waitImport(t, third, "completed"), map[string]float64{"created": 2})
	e.key = own
	if n := e.count("SELECT count(*) FROM subscribers WHERE newsletter_id = ?", e.nl); n != 2 {
		t.Errorf("%d subscribers, want 2", n)
	}
}

// importWorkerProcessEnv, set, makes the test binary an import worker process
// (runImportWorkerProcess) on the database WORKER_DATABASE_URL names: what kill -9 takes away
// in the middle of a batch, with its connections.
const importWorkerProcessEnv = "SUBSCRIBERD_TEST_IMPORT_WORKER"

func runImportWorkerProcess() int {
	db, err := repo.Open(os.Getenv("WORKER_DATABASE_URL"), repo.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "import worker process:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	batch := 100
	if n, err := strconv.Atoi(os.Getenv("WORKER_BATCH_SIZE")); err == nil {
		batch = n
	}
	w := importer.NewWorker(repo.NewImports(db), importer.Config{BatchSize: batch, Lease: time.Second, Interval: 50 * time.Millisecond})
	w.Run(ctx) //nolint:errcheck // nil
	return 0
}

// TestImportSurvivesKill9: the import worker process is killed (SIGKILL) in the middle of an
// import, twice, and started again; the import completes with every row accounted for exactly
// once: each address created once, with one event, and the counts add up.
func TestImportSurvivesKill9(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const rows = 6000
	var b strings.Builder
	b.WriteString("email,name\n")
	for i := range rows {
		if i%100 == 50 {
			fmt.Fprintf(&b, "bad%d,Nobody\n", i)
			continue
		}
		fmt.Fprintf(&b, "k%d@example.com,K %d\n", i, i)
	}
	loc := e.upload("text/csv", b.String(), "status=pending").want(t, http.StatusAccepted, "").header.Get("Location")
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), importWorkerProcessEnv+"=1", "WORKER_DATABASE_URL="+e.dsn)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck
		return cmd
	}
	processed := func() float64 {
		d := e.do(http.MethodGet, strings.TrimPrefix(loc, "/api/v1"), nil).want(t, http.StatusOK, "").data(t)
		return d["counts"].(map[string]any)["processed"].(float64)
	}
	last := 0.0
	for kill := range 2 {
		cmd := start()
		deadline := time.Now().Add(30 * time.Second)
		for processed() <= last { // at least one more batch committed
			if time.Now().After(deadline) {
				t.Fatalf("kill %d: no progress past %v rows", kill+1, last)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		cmd.Wait() //nolint:errcheck // killed
		if last = processed(); last >= rows {
			t.Fatalf("kill %d came after the end of the import (%v rows processed): the file is too small", kill+1, last)
		}
	}
	start()
	imp := e.waitImport(t, loc, "completed")
	const invalid = rows / 100
	wantCounts(t, imp, map[string]float64{"rows": rows, "processed": rows, "created": rows - invalid, "existing": 0, "invalid": invalid})
	for what, q := range map[string]string{
		"subscribers":          "SELECT count(*) FROM subscribers",
		"distinct addresses":   "SELECT count(DISTINCT email_key) FROM subscribers",
		"events":               "SELECT count(*) FROM subscriber_events",
		"confirmation emails":  "SELECT count(*) FROM email_outbox",
		"subscribers, counted": "SELECT coalesce(sum(n), 0) FROM subscriber_counts",
	} {
		if n := e.count(q); n != rows-invalid {
			t.Errorf("%d %s, want %d", n, what, rows-invalid)
		}
	}
	if n := e.count("SELECT count(*) FROM import_errors"); n != invalid {
		t.Errorf("%d row errors, want %d", n, invalid)
	}
}

// TestImportTakenOverAfterWorkerDies: an import worker keeps its import with the heartbeat
// lease the outbox workers use (outbox.Heartbeat), and its lease is short: 1 s here, 10 s by
// default. While it lives no other worker takes the import, for many leases; once it is
// killed (SIGKILL) mid-import, another worker takes the import over within the lease and a
// poll, well within the 15 s the service promises, and completes it with every row once.
func TestImportTakenOverAfterWorkerDies(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const rows = 10000
	var b strings.Builder
	b.WriteString("email\n")
	for i := range rows {
		fmt.Fprintf(&b, "t%d@example.com\n", i)
	}
	loc := e.upload("text/csv", b.String(), "").want(t, http.StatusAccepted, "").header.Get("Location")
	// Batches of 1 row: the dying worker's import lasts past the window below at any speed (at 5
	// rows a batch, SQLite on a quiet machine finished all 10,000 within it);
	// the worker that takes over finishes it in batches of 1,000.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), importWorkerProcessEnv+"=1", "WORKER_DATABASE_URL="+e.dsn, "WORKER_BATCH_SIZE=1")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck
	claim := func() string {
		var c uuid.NullUUID
		if err := e.db.NewRaw("SELECT claim FROM imports").Scan(context.Background(), &c); err != nil {
			t.Fatal(err)
		}
		if !c.Valid {
			return ""
		}
		return c.UUID.String()
	}
	waitFor(t, "the worker process to claim the import", func() bool { return claim() != "" })
	first := claim()

	// Another worker, with the same short lease, looks for imports every 20 ms.
	e.startImporter(t, importer.Config{BatchSize: 1000, Lease: time.Second})
	for range 30 { // 3 s, three leases: the heartbeat keeps the import with its worker
		if c := claim(); c != first && c != "" {
			t.Fatalf("the import was taken from its live worker (claim %s, then %s)", first, c)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if c := claim(); c != first {
		t.Fatalf("the import finished or moved before its worker was killed (claim %q): make it longer", c)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	cmd.Wait() //nolint:errcheck // killed
	waitFor(t, "another worker to take the import over", func() bool { c := claim(); return c != first })
	took := time.Since(killed)
	t.Logf("the import was taken over %v after its worker was killed (lease 1 s)", took.Round(time.Millisecond))
	if took > 15*time.Second {
		t.Errorf("the import was taken over %v after its worker died; want within 15 s", took.Round(time.Millisecond))
	}
	imp := e.waitImport(t, loc, "completed")
	wantCounts(t, imp, map[string]float64{"rows": rows, "processed": rows, "created": rows, "existing": 0})
	if n := e.count("SELECT count(*) FROM subscribers"); n != rows {
		t.Errorf("%d subscribers, want %d", n, rows)
	}
}

// TestImportSuppressed: a row whose address is suppressed (§13) is counted suppressed and
// subscribes nothing, also when the newsletter holds the address (the suppression is checked
// before the uniqueness rule) and when the file repeats it.
func TestImportSuppressed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.do(http.MethodPost, "/subscribers", map[string]any{"email": "held@example.com"}).want(t, http.StatusCreated, "")
	for _, addr := range []string{"gone@example.com", "held@example.com"} {
		e.do(http.MethodPost, "/suppressions", map[string]any{"email": addr}).want(t, http.StatusCreated, "")
	}
	e.startImporter(t, importer.Config{})
	file := "email\nGone@Example.com\nfresh@example.com\nheld@example.com\ngone@example.com\n"
	loc := e.upload("text/csv", file, "").want(t, http.StatusAccepted, "").header.Get("Location")
	imp := e.waitImport(t, loc, "completed")
	wantCounts(t, imp, map[string]float64{"rows": 4, "created": 1, "existing": 0, "suppressed": 3, "invalid": 0})
	if n := e.count("SELECT count(*) FROM subscribers WHERE email_key = 'gone@example.com'"); n != 0 {
		t.Errorf("a suppressed address was subscribed")
	}
	held := e.do(http.MethodGet, "/subscribers?email=held@example.com", nil).want(t, http.StatusOK, "").body["data"].([]any)
	if len(held) != 1 || held[0].(map[string]any)["status"] != "unsubscribed" {
		t.Errorf("held = %v, want it unsubscribed by its suppression and left so", held)
	}
}

// TestImportBatchSpansAndMetrics: each batch is a span ("import batch") linked to the trace
// of the upload, counting its rows; import_rows_total counts the rows by outcome, and
// imports_running is back to 0 once the import completed.
func TestImportBatchSpansAndMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	m := telemetry.NewMetrics("test")
	const upload = "00-0102030405060708090a0b0c0d0e0f10-0102030405060708-01"
	rows := []string{`{"email":"a@example.com"}`, `{"email":"b@example.com"}`, `{"email":"nope"}`}
	next := func() (map[string]any, error) {
		if len(rows) == 0 {
			return nil, io.EOF
		}
		var obj map[string]any
		err := json.Unmarshal([]byte(rows[0]), &obj)
		rows = rows[1:]
		return obj, err
	}
	imp, err := repo.NewImports(e.db).Stage(context.Background(), model.NewImport{NewsletterID: e.nl, Format: model.ImportNDJSON,
		DefaultStatus: model.StatusActive, KeyPrefix: "sk_test", Traceparent: upload}, next)
	if err != nil {
		t.Fatal(err)
	}
	e.startImporter(t, importer.Config{BatchSize: 2, TracerProvider: tp, Recorder: m})
	e.waitImport(t, "/api/v1/imports/"+imp.ID.String(), "completed")

	var batches int
	var created int64
	for _, s := range rec.Ended() {
		if s.Name() != "import batch" {
			continue
		}
		batches++
		if len(s.Links()) != 1 || s.Links()[0].SpanContext.TraceID().String() != "0102030405060708090a0b0c0d0e0f10" {
			t.Errorf("batch span links %v, want the upload's trace", s.Links())
		}
		for _, a := range s.Attributes() {
			if a.Key == "import.created" {
				created += a.Value.AsInt64()
			}
		}
	}
	if batches != 2 || created != 2 {
		t.Errorf("%d batch spans counting %d created rows, want 2 and 2", batches, created)
	}
	if got := counterSum(t, m, "import_rows_total", "outcome", "created"); got != 2 {
		t.Errorf("import_rows_total{outcome=created} = %v, want 2", got)
	}
	if got := counterSum(t, m, "import_rows_total", "outcome", "invalid"); got != 1 {
		t.Errorf("import_rows_total{outcome=invalid} = %v, want 1", got)
	}
	// The worker lowers the gauge as it returns from the import, just after the commit.
	running := func() float64 {
		mfs, err := m.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "imports_running" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	deadline := time.Now().Add(5 * time.Second)
	for running() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("imports_running = %v after the import completed", running())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestImportRateLimits: an upload is one request against the key's windows and is not counted
// in the bulk windows (§15).
func TestImportRateLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withLimits(limitsConfig(t, "3/1m", "1/1m", "off", "off")))
	for range 2 { // two imports, over the bulk window of 1
		e.upload("text/csv", "email\na@example.com\n", "").want(t, http.StatusAccepted, "")
	}
	e.do(http.MethodPost, "/subscribers/bulk", []map[string]any{{"email": "b@example.com"}}).want(t, http.StatusCreated, "")
	// The fourth request of the minute: over the key's window of 3.
	e.upload("text/csv", "email\nc@example.com\n", "").want(t, http.StatusTooManyRequests, "rate_limit_exceeded")
}

// TestImportClaimKeepsOrder: while another worker is claiming a newsletter's oldest queued
// import (holding its row), the next one of that newsletter is not taken in its place.
func TestImportClaimKeepsOrder(t *testing.T) {
	t.Parallel()
	postgresOnly(t, "holds a row lock in a second transaction while claiming; SQLite has one writer at a time")
	e := newEnv(t)
	first := e.upload("text/csv", "email\na@example.com\n", "").want(t, http.StatusAccepted, "").data(t)["id"].(string)
	e.upload("text/csv", "email\nb@example.com\n", "").want(t, http.StatusAccepted, "")
	ctx := context.Background()
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(ctx, "SELECT id FROM imports WHERE id = ? FOR UPDATE", first); err != nil {
		t.Fatal(err)
	}
	store := repo.NewImports(e.db)
	if job, ok, err := store.Claim(ctx, time.Minute); err != nil || ok {
		t.Fatalf("claim while the oldest is held: %v %v %v, want none", job.ID, ok, err)
	}
	tx.Rollback() //nolint:errcheck
	if job, ok, err := store.Claim(ctx, time.Minute); err != nil || !ok || job.ID.String() != first {
		t.Fatalf("claim = %v %v %v, want the oldest %s", job.ID, ok, err, first)
	}
}

// TestImportQueuesWebhooks: a created row's event is delivered to the newsletter's endpoints,
// as a create's is, queued in the row's batch; an existing row queues nothing.
func TestImportQueuesWebhooks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.do(http.MethodPost, "/subscribers", map[string]any{"email": "old@example.com"}).want(t, http.StatusCreated, "")
	e.do(http.MethodPost, "/webhooks", map[string]any{"url": "http://127.0.0.1:9/hook", "events": []string{"subscriber.created"}}).
		want(t, http.StatusCreated, "")
	e.startImporter(t, importer.Config{})
	loc := e.upload("text/csv", "email\na@example.com\nold@example.com\nb@example.com\n", "").want(t, http.StatusAccepted, "").header.Get("Location")
	wantCounts(t, e.waitImport(t, loc, "completed"), map[string]float64{"created": 2, "existing": 1})
	if n := e.count(`SELECT count(*) FROM webhook_deliveries d JOIN subscriber_events ev ON ev.id = d.event_id
		JOIN subscribers s ON s.id = ev.subscriber_id WHERE s.email_key IN ('a@example.com', 'b@example.com')`); n != 2 {
		t.Errorf("%d deliveries queued for the imported subscribers, want 2", n)
	}
	if n := e.count(`SELECT count(*) FROM webhook_deliveries`); n != 2 {
		t.Errorf("%d deliveries in all, want the 2 of the import (the endpoint came after old@)", n)
	}
}
