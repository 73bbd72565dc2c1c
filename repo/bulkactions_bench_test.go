package repo_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// TestBulkTag1M measures the benchmark scenario bulk_tag_1m (docs/api-contract.md §20.2): a
// tag added (or BULK_BENCH_ACTION) to every subscriber of a newsletter of SUBSCRIBERD_BULK_BENCH subscribers
// (1,000,000 for the scenario) on PostgreSQL, in batches of BULK_BENCH_BATCH (default
// 5000), as a worker runs it. It runs only when SUBSCRIBERD_BULK_BENCH is set.
func TestBulkTag1M(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SUBSCRIBERD_BULK_BENCH"))
	if n <= 0 {
		t.Skip("set SUBSCRIBERD_BULK_BENCH=1000000 to run bulk_tag_1m")
	}
	batch := 5000
	if b, err := strconv.Atoi(os.Getenv("BULK_BENCH_BATCH")); err == nil {
		batch = b
	}
	db, nl := openFresh(t)
	ctx := context.Background()
	seeded := time.Now()
	for from := 1; from <= n; from += 100000 {
		if _, err := db.NewRaw(`INSERT INTO subscribers (id, newsletter_id, email, email_key, first_name, last_name, status, created_at, updated_at)
SELECT uuid_v7(), ?, 'b' || i || '@example.com', 'b' || i || '@example.com', 'Bench', 'User ' || i, 'active', now(), now()
FROM generate_series(?::int, ?::int) AS i`, nl, from, min(n, from+99999)).Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.NewRaw("VACUUM ANALYZE subscribers").Exec(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("seeded %d subscribers in %v", n, time.Since(seeded))
	store := repo.NewBulkActions(db)
	start := time.Now()
	a, err := store.Create(ctx, model.NewBulkAction{BulkRequest: model.BulkRequest{
		BulkChange: benchChange(os.Getenv("BULK_BENCH_ACTION")),
		Target:     model.BulkTarget{Filter: &model.Filter{}}}, NewsletterID: nl, KeyPrefix: "sk_bench"})
	if err != nil {
		t.Fatal(err)
	}
	job, ok, err := store.Claim(ctx, time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	var staged time.Duration
	for i := 0; ; i++ {
		bt := time.Now()
		_, done, err := store.Batch(ctx, job, batch, time.Minute)
		if i%50 == 1 {
			t.Logf("batch %d: %v", i, time.Since(bt))
		}
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			staged = time.Since(start)
		}
		if done {
			break
		}
	}
	took := time.Since(start)
	got, err := store.Get(ctx, nl, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Counts.Changed != int64(n) {
		t.Fatalf("counts = %+v", got.Counts)
	}
	hwm := ""
	if status, err := os.ReadFile("/proc/self/status"); err == nil {
		for line := range strings.SplitSeq(string(status), "\n") {
			if strings.HasPrefix(line, "VmHWM:") {
				hwm = strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:"))
			}
		}
	}
	t.Logf("bulk_tag_%d: %v (staging %v), batch %d, %.0f subscribers/s; peak RSS of this process %s",
		n, took, staged, batch, float64(n)/took.Seconds(), hwm)
}

// benchChange is the change TestBulkTag1M makes: add_tags (the scenario), or another action
// (BULK_BENCH_ACTION) for comparison.
func benchChange(action string) model.BulkChange {
	switch action {
	case model.ActionRemoveTags:
		return model.BulkChange{Action: action, Tags: []string{"bench"}}
	case model.ActionSetAttributes:
		return model.BulkChange{Action: action, Attributes: model.AttributesPatch{"plan": "pro"}}
	case model.ActionUnsubscribe:
		return model.BulkChange{Action: action}
	}
	return model.BulkChange{Action: model.ActionAddTags, Tags: []string{"bench"}}
}
