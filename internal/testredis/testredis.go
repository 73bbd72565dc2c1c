// Package testredis gives tests a real Redis: TEST_REDIS_URL when set, otherwise a container
// started with testcontainers from REDIS_IMAGE (default redis:7) on first use. Each caller
// gets a key prefix of its own, whose keys are removed when the test ends. Without either
// source, tests fail with a message saying so: they never pass by skipping.
package testredis

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

var (
	once sync.Once
	url  string
	err  error
	stop func()
)

// URL returns the URL of the test Redis, starting a container on first use.
func URL(t testing.TB) string {
	t.Helper()
	once.Do(start)
	if err != nil {
		t.Fatalf("this test needs Redis: set TEST_REDIS_URL (e.g. redis://127.0.0.1:6379/0), or make Docker "+
			"available with the image REDIS_IMAGE (default redis:7) present or pullable: %v", err)
	}
	return url
}

// Stop removes the container, if one was started. Call it from TestMain after m.Run.
func Stop() {
	if stop != nil {
		stop()
	}
}

func start() {
	if url = os.Getenv("TEST_REDIS_URL"); url != "" {
		_, err = redis.ParseURL(url)
		if err != nil {
			err = fmt.Errorf("TEST_REDIS_URL: %w", err)
		}
		return
	}
	img := os.Getenv("REDIS_IMAGE")
	if img == "" {
		img = "redis:7"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ctr, cerr := testcontainers.Run(ctx, img, testcontainers.WithExposedPorts("6379/tcp"),
		testcontainers.WithWaitStrategy(wait.ForListeningPort("6379/tcp")))
	if cerr != nil {
		if ctr != nil {
			testcontainers.TerminateContainer(ctr) //nolint:errcheck // best effort
		}
		err = fmt.Errorf("starting a Redis container from %s: %w", img, cerr)
		return
	}
	stop = func() { testcontainers.TerminateContainer(ctr) } //nolint:errcheck // best effort at exit
	addr, perr := ctr.PortEndpoint(ctx, "6379/tcp", "")
	if perr != nil {
		err = perr
		return
	}
	url = "redis://" + addr + "/0"
	fmt.Fprintln(os.Stderr, "testredis: using a Redis container from", img)
}

// Prefix returns a key prefix of t's own and removes every key under it when t ends.
func Prefix(t testing.TB) string {
	t.Helper()
	opt, perr := redis.ParseURL(URL(t))
	if perr != nil {
		t.Fatal(perr)
	}
	prefix := "subscriberd-test:" + rand.Text()[:12] + ":"
	t.Cleanup(func() {
		rdb := redis.NewClient(opt)
		defer rdb.Close()
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
		if serr := iter.Err(); serr != nil {
			t.Errorf("removing the keys %s*: %v", prefix, serr)
		}
	})
	return prefix
}

// Client returns a client of the test Redis, closed when t ends, and a key prefix of t's own.
func Client(t testing.TB) (*redis.Client, string) {
	t.Helper()
	opt, perr := redis.ParseURL(URL(t))
	if perr != nil {
		t.Fatal(perr)
	}
	prefix := Prefix(t)
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	if perr := rdb.Ping(context.Background()).Err(); perr != nil {
		t.Fatalf("test Redis at %s: %v", opt.Addr, perr)
	}
	return rdb, prefix
}
