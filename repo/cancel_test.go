package repo_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/internal/testdb"
	"github.com/subscriberd/subscriberd/repo"
)

// tagged is a row of the statements below: the tag its statement was given, and its number.
type tagged struct {
	Tag int64 `bun:"tag"`
	N   int64 `bun:"n"`
}

// taggedText returns, for $1 a tag and $2 a count, that many rows carrying the tag, after
// sleeping $3 seconds.
const taggedText = `WITH s AS (SELECT pg_sleep($3::float8))
SELECT $1::bigint AS tag, g::bigint AS n FROM s, generate_series(1, $2::int) AS g`

// taggedBun is taggedText for bun's statements (simple protocol, values inlined).
const taggedBun = `WITH s AS (SELECT pg_sleep(?2::float8))
SELECT ?0::bigint AS tag, g::bigint AS n FROM s, generate_series(1, ?1::int) AS g`

// Statements cut short by their context's end, before their first row or in the middle of
// their rows, prepared ones and bun's alike, leave nothing behind on the pool: afterwards
// 1,000 statements on the same few connections each read exactly their own rows. A cut
// statement fails with its context's error, and nothing else fails.
func TestStatementsCutShortLeaveThePoolClean(t *testing.T) {
	if testdb.Store() != testdb.Postgres {
		t.Skip("PostgreSQL only: the connections are network connections with a protocol to fall out of step with; SQLite's statements run in process")
	}
	db, err := repo.Open(pg.Fresh(t), repo.Options{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	run := func(ctx context.Context, prepared bool, tag int64, rows int, sleep time.Duration) ([]tagged, error) {
		var got []tagged
		var err error
		if prepared {
			err = repo.QueryRows(ctx, db, taggedText, &got, tag, rows, sleep.Seconds())
		} else {
			err = db.NewRaw(taggedBun, tag, rows, sleep.Seconds()).Scan(ctx, &got)
		}
		return got, err
	}

	// Cut: deadlines and cancellations at random points, while the server sleeps (before the
	// first row) or streams 100,000 rows (tens of milliseconds even on a quiet machine: 3,000
	// streamed so fast there that too few were cut).
	const cuts = 300
	var cut, finished atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < cuts; i += 4 {
				wait := time.Duration(rand.N(50000)) * time.Microsecond
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				if i%2 == 1 { // a cancellation without a deadline: the client hung up
					ctx, cancel = context.WithCancel(context.Background())
					time.AfterFunc(wait, cancel)
				}
				rows, sleep := 100_000, time.Duration(0)
				if i%3 == 0 {
					rows, sleep = 5, time.Duration(rand.N(8))*time.Millisecond
				}
				tag := int64(1_000_000 + i)
				got, err := run(ctx, i%4 < 2, tag, rows, sleep)
				cancel()
				switch {
				case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
					cut.Add(1)
				case err != nil:
					t.Errorf("cut statement %d (prepared %v): %v; want its context's error or its rows", i, i%4 < 2, err)
				default:
					finished.Add(1)
					if err := checkTagged(got, tag, rows); err != nil {
						t.Errorf("cut statement %d finished: %v", i, err)
					}
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d statements cut short, %d finished", cut.Load(), finished.Load())
	if cut.Load() < cuts/4 {
		t.Fatalf("only %d of %d statements were cut short; the test did not test anything", cut.Load(), cuts)
	}

	// Check: 1,000 statements on the same pool, each its own rows.
	var next atomic.Int64
	for range 8 {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > 1000 {
					return
				}
				rows := int(1 + i%7)
				got, err := run(context.Background(), i%2 == 0, i, rows, 0)
				if err != nil {
					t.Errorf("statement %d: %v", i, err)
					continue
				}
				if err := checkTagged(got, i, rows); err != nil {
					t.Errorf("statement %d: %v", i, err)
				}
			}
		})
	}
	wg.Wait()
}

// checkTagged reports whether got is exactly rows rows tagged tag, numbered from 1.
func checkTagged(got []tagged, tag int64, rows int) error {
	if len(got) != rows {
		return fmt.Errorf("%d rows, want %d (tag %d): %v", len(got), rows, tag, head(got))
	}
	for i, r := range got {
		if r.Tag != tag || r.N != int64(i+1) {
			return fmt.Errorf("row %d is %+v, want {Tag:%d N:%d}", i, r, tag, i+1)
		}
	}
	return nil
}

func head(rows []tagged) []tagged {
	if len(rows) > 3 {
		return rows[:3]
	}
	return rows
}
