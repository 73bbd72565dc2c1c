package pgstat

import (
	"context"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/subscriberd/subscriberd/internal/testdb"
)

// pg is the test PostgreSQL (TEST_DATABASE_URL, else a container; see internal/testdb).
var pg *testdb.Server

func TestMain(m *testing.M) { os.Exit(testdb.Main(m, &pg)) }

func TestDelta(t *testing.T) {
	before := map[int64]StatementStat{
		1: {QueryID: 1, Query: "INSERT a", Calls: 10, ExecMs: 5, Rows: 10, WALBytes: 1000},
		2: {QueryID: 2, Query: "SELECT b", Calls: 4, ExecMs: 1},
		3: {QueryID: 3, Query: "SELECT c", Calls: 7, ExecMs: 2},
	}
	after := map[int64]StatementStat{
		1: {QueryID: 1, Query: "INSERT a", Calls: 110, ExecMs: 105, Rows: 110, WALBytes: 51000},
		2: {QueryID: 2, Query: "SELECT b", Calls: 204, ExecMs: 11},
		3: {QueryID: 3, Query: "SELECT c", Calls: 7, ExecMs: 2}, // did not run: left out
		4: {QueryID: 4, Query: "UPDATE d", Calls: 3, ExecMs: 30},
		5: {QueryID: 5, Query: "SELECT x FROM pg_stat_activity", Calls: 300, ExecMs: 50}, // the probe's own
	}
	got := Delta(before, after)
	want := []StatementStat{
		{QueryID: 1, Query: "INSERT a", Calls: 100, ExecMs: 100, Rows: 100, WALBytes: 50000},
		{QueryID: 4, Query: "UPDATE d", Calls: 3, ExecMs: 30},
		{QueryID: 2, Query: "SELECT b", Calls: 200, ExecMs: 10},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Delta (-want +got):\n%s", diff)
	}
}

func TestAddStatements(t *testing.T) {
	d := []StatementStat{
		{QueryID: 1, Query: "WITH s AS (\n    INSERT INTO subscribers ...)", Calls: 100, ExecMs: 150, PlanMs: 0, Rows: 100, WALBytes: 200000, SharedHit: 900, SharedRead: 100},
		{QueryID: 2, Query: "BEGIN", Calls: 50, ExecMs: 1},
	}
	var w Where
	w.addStatements(d, 100)
	opt := cmpopts.EquateApprox(0, 1e-9)
	if diff := cmp.Diff(1.5, w.StatementsPerRequest, opt); diff != "" {
		t.Errorf("statements per request (-want +got): %s", diff)
	}
	if diff := cmp.Diff(1.51, w.ExecMsPerRequest, opt); diff != "" {
		t.Errorf("exec ms per request (-want +got): %s", diff)
	}
	if diff := cmp.Diff(2000.0, w.WALPerRequest, opt); diff != "" {
		t.Errorf("WAL per request (-want +got): %s", diff)
	}
	want := []Statement{
		{Query: "WITH s AS ( INSERT INTO subscribers ...)", CallsPerRequest: 1, MeanExecMs: 1.5, WALPerCall: 2000, RowsPerCall: 1, BlocksPerCall: 10},
		{Query: "BEGIN", CallsPerRequest: 0.5, MeanExecMs: 0.02},
	}
	if diff := cmp.Diff(want, w.Statements, opt); diff != "" {
		t.Errorf("statements (-want +got):\n%s", diff)
	}

	var none Where
	none.addStatements(d, 0)
	if none.StatementsPerRequest != 0 || none.Statements != nil {
		t.Errorf("no requests: got %+v, want nothing", none)
	}
}

func TestAddStatementsListsAtMostMax(t *testing.T) {
	var d []StatementStat
	for i := range MaxStatements + 3 {
		d = append(d, StatementStat{QueryID: int64(i), Query: "q", Calls: 1, ExecMs: 1})
	}
	var w Where
	w.addStatements(d, 1)
	if len(w.Statements) != MaxStatements {
		t.Errorf("listed %d statements, want %d", len(w.Statements), MaxStatements)
	}
	if w.StatementsPerRequest != float64(MaxStatements+3) {
		t.Errorf("statements per request = %v, want every one counted: %d", w.StatementsPerRequest, MaxStatements+3)
	}
}

func TestAddWaits(t *testing.T) {
	// Four samples 10 ms apart over 8 requests: 10 backend-samples = 100 ms of backend time,
	// 12.5 ms a request.
	samples := []Sample{
		{"CPU": 2, "Lock:transactionid": 1},
		{"CPU": 1, "LWLock:WALWrite": 2},
		{"IO:WALSync": 1},
		{"CPU": 1, "Lock:tuple": 2},
	}
	var w Where
	w.addWaits(samples, 10*time.Millisecond, 8)
	opt := cmpopts.EquateApprox(0, 1e-9)
	want := []Wait{
		{Event: "CPU", UsPerRequest: 5000, Share: 0.4},
		{Event: "LWLock:WALWrite", UsPerRequest: 2500, Share: 0.2},
		{Event: "Lock:tuple", UsPerRequest: 2500, Share: 0.2},
		{Event: "IO:WALSync", UsPerRequest: 1250, Share: 0.1},
		{Event: "Lock:transactionid", UsPerRequest: 1250, Share: 0.1},
	}
	if diff := cmp.Diff(want, w.Waits, opt); diff != "" {
		t.Errorf("waits (-want +got):\n%s", diff)
	}
	if w.Samples != 4 || math.Abs(w.ActiveBackends-2.5) > 1e-9 {
		t.Errorf("samples %d, active backends %v; want 4 and 2.5", w.Samples, w.ActiveBackends)
	}
	if math.Abs(w.LockWaitUsPerRequest-3750) > 1e-9 || math.Abs(w.LWLockWaitUsPerRequest-2500) > 1e-9 {
		t.Errorf("lock waits %v µs, LWLock waits %v µs per request; want 3750 and 2500", w.LockWaitUsPerRequest, w.LWLockWaitUsPerRequest)
	}

	var idle Where
	idle.addWaits([]Sample{{}, {}}, 10*time.Millisecond, 8)
	if idle.Samples != 2 || idle.ActiveBackends != 0 || idle.Waits != nil {
		t.Errorf("idle samples: got %+v, want 2 samples and no waits", idle)
	}
}

func TestShorten(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"SELECT 1", 20, "SELECT 1"},
		{"WITH s AS (\n\tINSERT  INTO t)", 40, "WITH s AS ( INSERT INTO t)"},
		{"SELECT é FROM subscribers", 10, "SELECT é …"},
	} {
		if got := Shorten(tc.in, tc.n); got != tc.want {
			t.Errorf("Shorten(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

// TestWindowOnServer runs a window on the test server around a few statements of another
// connection that waits on a row lock, and checks that the WAL and the lock wait are seen
// (and the statements, where the server has pg_stat_statements loaded).
func TestWindowOnServer(t *testing.T) {
	dsn := pg.Fresh(t)
	ctx := context.Background()
	p, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.Interval = 5 * time.Millisecond
	if !p.Statements && p.Note == "" {
		t.Error("no pg_stat_statements and no note saying so")
	}

	const app = "pgstat-test"
	other, err := open(ctx, dsn, app)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	table := "pgstat_test_" + time.Now().Format("150405_000000")
	if _, err := p.db.ExecContext(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY, n int)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.db.ExecContext(context.Background(), "DROP TABLE "+table) })
	if _, err := p.db.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1, 0)"); err != nil {
		t.Fatal(err)
	}

	w, err := p.Start(ctx, app)
	if err != nil {
		t.Fatal(err)
	}
	// One transaction holds the row for 300 ms while another connection's update waits.
	holder, err := other.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.ExecContext(ctx, "UPDATE "+table+" SET n = n + 1 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := other.ExecContext(ctx, "UPDATE "+table+" SET n = n + 1 WHERE id = 1")
		waited <- err
	}()
	// The row is held until the window has sampled the waiter waiting for it 20 times, however
	// slowly a loaded machine runs the sampler: 20 samples of 5 ms over 2 requests is 50 ms a
	// request at least.
	const seen = 20
	deadline := time.Now().Add(time.Minute)
	for lockSamples(w) < seen {
		if time.Now().After(deadline) {
			t.Fatalf("the sampler saw the waiting update %d times in a minute, want %d", lockSamples(w), seen)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	wh, err := w.Stop(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if wh.ClusterWALBytes <= 0 {
		t.Errorf("cluster WAL = %d bytes, want the updates' WAL", wh.ClusterWALBytes)
	}
	if want := float64(seen) * float64(p.Interval.Microseconds()) / 2; wh.LockWaitUsPerRequest < want {
		t.Errorf("lock wait %.0f µs per request, want at least %.0f (waits %+v, samples %d)", wh.LockWaitUsPerRequest, want, wh.Waits, wh.Samples)
	}
	if p.Statements {
		if wh.StatementsPerRequest < 1 {
			t.Errorf("statements per request %v, want the two updates (and the commit) seen: %+v", wh.StatementsPerRequest, wh.Statements)
		}
		if wh.WALPerRequest <= 0 {
			t.Errorf("WAL per request from the statements = %v, want > 0", wh.WALPerRequest)
		}
	} else {
		t.Logf("statements not measured here: %s", p.Note)
	}
}

// lockSamples counts the samples of w so far in which a backend waited for a lock.
func lockSamples(w *Window) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, s := range w.samples {
		for e := range s {
			if strings.HasPrefix(e, "Lock:") {
				n++
				break
			}
		}
	}
	return n
}
