// Package redisratebench compares the cost of one rate decision over the default windows on
// Redis: github.com/go-redis/redis_rate/v10 (one round trip per window, not all or nothing)
// against limits.Redis (one Lua script for every window). It is its own module, so the main
// module does not depend on redis_rate.
//
//	cd limits/testdata/redisratebench
//	TEST_REDIS_URL=redis://127.0.0.1:6379/0 go test -bench . -benchtime 3s
package redisratebench

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"testing"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/subscriberd/subscriberd/limits"
)

func client(b *testing.B) (*redis.Client, string) {
	url := os.Getenv("TEST_REDIS_URL")
	if url == "" {
		b.Fatal("set TEST_REDIS_URL, e.g. redis://127.0.0.1:6379/0")
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		b.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	prefix := "subscriberd-bench:" + rand.Text()[:10] + ":"
	b.Cleanup(func() {
		ctx := context.Background()
		for _, p := range []string{prefix + "*", "rate:" + prefix + "*"} {
			iter := rdb.Scan(ctx, 0, p, 1000).Iterator()
			for iter.Next(ctx) {
				rdb.Del(ctx, iter.Val())
			}
		}
		rdb.Close()
	})
	return rdb, prefix
}

// windows returns the default windows with limits a benchmark never reaches.
func windows(b *testing.B) (rate, bulk []limits.Window) {
	rate, err := limits.ParseWindows("RATE_LIMITS", limits.DefaultRateLimits)
	if err != nil {
		b.Fatal(err)
	}
	bulk, err = limits.ParseWindows("BULK_RATE_LIMITS", limits.DefaultBulkRateLimits)
	if err != nil {
		b.Fatal(err)
	}
	for i := range rate {
		rate[i].Limit *= 1_000_000
	}
	for i := range bulk {
		bulk[i].Limit *= 1_000_000
	}
	return rate, bulk
}

func BenchmarkDecision(b *testing.B) {
	ctx := context.Background()
	for _, isBulk := range []bool{false, true} {
		kind := "plain"
		if isBulk {
			kind = "bulk"
		}
		b.Run("redis_rate/"+kind, func(b *testing.B) {
			rdb, prefix := client(b)
			rl := redis_rate.NewLimiter(rdb)
			rate, bulk := windows(b)
			ws := rate
			if isBulk {
				ws = append(ws, bulk...)
			}
			lims := make([]redis_rate.Limit, len(ws))
			for i, w := range ws {
				lims[i] = redis_rate.Limit{Rate: w.Limit, Burst: w.Limit, Period: w.Period}
			}
			i := 0
			for b.Loop() {
				key := fmt.Sprintf("%skey-%d", prefix, i%1000)
				for j, l := range lims {
					res, err := rl.Allow(ctx, fmt.Sprintf("%s:%d", key, j), l)
					if err != nil || res.Allowed == 0 {
						b.Fatal("denied", err)
					}
				}
				i++
			}
		})
		b.Run("lua/"+kind, func(b *testing.B) {
			rdb, prefix := client(b)
			rate, bulk := windows(b)
			l := limits.New(limits.Config{Rate: rate, Bulk: bulk}, limits.NewRedis(rdb, prefix, nil))
			i := 0
			for b.Loop() {
				if !l.CheckKey(ctx, fmt.Sprintf("key-%d", i%1000), isBulk).Allowed {
					b.Fatal("denied")
				}
				i++
			}
		})
	}
}
