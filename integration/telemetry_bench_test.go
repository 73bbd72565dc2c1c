package integration

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
)

// BenchmarkTelemetry compares the throughput of an authenticated read (GET one subscriber, over
// loopback HTTP against the real PostgreSQL) with telemetry fully off — no tracing middleware,
// no tracer provider, no metrics, no access log — and fully on, as `serve` runs it: the tracing
// handler, 100 % sampling, spans batched to an OTLP/HTTP receiver on loopback, the Prometheus
// metrics with exemplars and the JSON access log (through a LogBuffer to io.Discard). "on10" is "on" with
// 10 % of traces sampled, as production would run it.
//
//	TEST_DATABASE_URL=... go test -run '^$' -bench Telemetry -count 6 ./integration
//
// The read is the cheapest database round trip the API has, so the relative overhead is the
// largest any operation sees. docs/benchmarks.md reports the figures.
//
// The "memory" variants replace PostgreSQL by an in-memory store, so they measure the CPU cost
// of telemetry alone, without the noise of a shared database; against a real request that
// cost is a smaller share.
func BenchmarkTelemetry(b *testing.B) {
	for _, backend := range []string{"postgres", "memory"} {
		for _, mode := range []string{"off", "on", "on10"} {
			b.Run(backend+"/"+mode, func(b *testing.B) { benchTelemetry(b, backend, mode) })
		}
	}
}

func benchTelemetry(b *testing.B, backend, mode string) {
	b.ReportAllocs()
	ctx := context.Background()
	db, err := repo.Open(pg.Fresh(b), repo.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	accounts := repo.NewAccounts(db)
	nl, err := accounts.CreateNewsletter(ctx, "bench", true)
	if err != nil {
		b.Fatal(err)
	}
	_, key, err := accounts.CreateKey(ctx, nl.ID, "bench")
	if err != nil {
		b.Fatal(err)
	}
	store := repo.NewSubscribers(db)
	sub, err := store.Create(ctx, nl.ID, model.NewSubscriber{Email: "bench@example.com", Status: model.StatusActive})
	if err != nil {
		b.Fatal(err)
	}

	cfg := api.Config{Store: store, Auth: accounts}
	if backend == "memory" {
		cfg = api.Config{Store: memStore{sub: sub}, Auth: memAuth{p: model.Principal{KeyID: nl.ID, NewsletterID: nl.ID, APIAccess: true}}}
	}
	var handler http.Handler
	var exported atomic.Int64
	var tp *sdktrace.TracerProvider
	if mode == "off" {
		useTracerProvider(noop.NewTracerProvider())
		handler = api.New(cfg)
	} else {
		receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, _ := io.Copy(io.Discard, r.Body)
			exported.Add(n)
			w.Header().Set("Content-Type", "application/x-protobuf")
		}))
		b.Cleanup(receiver.Close)
		// The exporter SetupTracing chooses for `serve` with OTEL_EXPORTER_OTLP_ENDPOINT set.
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(receiver.URL))
		if err != nil {
			b.Fatal(err)
		}
		sampler := sdktrace.AlwaysSample()
		if mode == "on10" { // what production would run: 10 % of traces sampled
			sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.1))
		}
		tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithSampler(sampler))
		useTracerProvider(tp)
		// Through a LogBuffer, as serve writes it.
		logw := telemetry.NewLogBuffer(io.Discard)
		b.Cleanup(func() { logw.Close() })
		log, err := telemetry.NewLogger(logw, "info", "json")
		if err != nil {
			b.Fatal(err)
		}
		m := telemetry.NewMetrics("bench")
		if err := m.RegisterDB(db.DB.DB); err != nil {
			b.Fatal(err)
		}
		cfg.Metrics, cfg.Logger = m, log
		handler = telemetry.NewHTTPHandler(api.New(cfg), testServerAddress, nil)
	}
	b.Cleanup(func() { useTracerProvider(recordingTP) })
	srv := httptest.NewServer(handler)
	b.Cleanup(srv.Close)

	url := srv.URL + api.BasePath + "/subscribers/" + sub.ID.String()
	client := srv.Client()
	get := func() {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, res.Body) //nolint:errcheck
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			b.Fatalf("status %d", res.StatusCode)
		}
	}
	for range 20 { // warm the pool, the key cache and the connections
		get()
	}
	cpu0 := cpuTime(b)
	b.ResetTimer()
	for b.Loop() {
		get()
	}
	b.StopTimer()
	// CPU time of the whole process (server, client, exporter and receiver) per request:
	// steadier than wall time on a shared machine, and what bounds throughput when the service
	// is CPU-bound.
	b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	if tp != nil {
		if err := tp.Shutdown(ctx); err != nil {
			b.Fatal(err)
		}
		if exported.Load() == 0 {
			b.Fatal("telemetry on, but no span reached the OTLP receiver")
		}
		b.ReportMetric(float64(exported.Load())/float64(b.N), "otlp-bytes/op")
	}
}

// memStore serves the one subscriber it holds; the benchmark calls nothing else.
type memStore struct {
	api.Store
	sub model.Subscriber
}

func (m memStore) Get(_ context.Context, _, id uuid.UUID) (model.Subscriber, error) {
	if id != m.sub.ID {
		return model.Subscriber{}, model.ErrNotFound
	}
	return m.sub, nil
}

type memAuth struct{ p model.Principal }

func (m memAuth) Authenticate(context.Context, []byte) (model.Principal, error) { return m.p, nil }

// cpuTime is the user and system CPU time this process has used.
func cpuTime(b testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
