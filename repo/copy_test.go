package repo_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/repo"
)

// pgdriver's COPY works on the pool's wrapped connections, inside a transaction, and leaves
// the connection in the pool; a COPY whose context ends mid-stream fails with the context's
// error and its connection is dropped, the next statement running on a new one.
func TestCopyOnThePoolsConnections(t *testing.T) {
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: COPY is PostgreSQL's")
	}
	ctx := context.Background()
	db, err := repo.Open(pg.Fresh(t), repo.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	backend := func() int {
		t.Helper()
		var pid int
		if err := db.NewRaw("SELECT pg_backend_pid()").Scan(ctx, &pid); err != nil {
			t.Fatal(err)
		}
		return pid
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE copied (n int, s text)"); err != nil {
		t.Fatal(err)
	}
	before := backend()

	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"BEGIN", "INSERT INTO copied VALUES (0, 'first')"} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	res, err := repo.CopyFrom(ctx, conn, strings.NewReader("1\ta\n2\tb\n"), "COPY copied (n, s) FROM STDIN")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 2 {
		t.Errorf("COPY reports %d rows, want 2", n)
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	var n int
	if err := db.NewRaw("SELECT count(*) FROM copied").Scan(ctx, &n); err != nil || n != 3 {
		t.Fatalf("%d rows after the COPY's transaction (%v), want 3", n, err)
	}
	if after := backend(); after != before {
		t.Errorf("the COPY's connection was replaced (backend %d, then %d); want it kept", before, after)
	}

	// A COPY whose client goes away mid-stream.
	cctx, cancel := context.WithCancel(ctx)
	conn, err = db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(200*time.Millisecond, cancel)
	_, err = repo.CopyFrom(cctx, conn, &stalling{ctx: cctx, first: "3\tc\n"}, "COPY copied (n, s) FROM STDIN")
	if !errors.Is(err, context.Canceled) {
		t.Errorf("COPY cut short: %v, want context.Canceled", err)
	}
	conn.Close()
	if err := db.NewRaw("SELECT count(*) FROM copied").Scan(ctx, &n); err != nil || n != 3 {
		t.Fatalf("%d rows after the cut COPY (%v), want 3", n, err)
	}
	if after := backend(); after == before {
		t.Error("the cut COPY's connection went back to the pool; want it dropped")
	}
}

// stalling yields first, then nothing until ctx ends.
type stalling struct {
	ctx   context.Context
	first string
}

func (s *stalling) Read(p []byte) (int, error) {
	if s.first != "" {
		n := copy(p, s.first)
		s.first = s.first[n:]
		return n, nil
	}
	<-s.ctx.Done()
	return 0, io.ErrUnexpectedEOF
}
