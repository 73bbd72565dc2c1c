package api_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/internal/logbuf"
	"github.com/subscriberd/subscriberd/model"
)

// hangupStore's bulk create waits for the request's client to go away, then ends as the real
// store does then: with the transaction rolled back under it (commitAnyway false), or with the
// rows committed just as the client left (true), so the answer meets a closed connection.
type hangupStore struct {
	api.Store
	commitAnyway bool
	entered      chan struct{}
	once         sync.Once
}

func (s *hangupStore) CreateMany(ctx context.Context, nl uuid.UUID, in []model.NewSubscriber) ([]model.Subscriber, error) {
	s.once.Do(func() { close(s.entered) })
	<-ctx.Done()
	if !s.commitAnyway {
		// database/sql rolls a transaction back when its context ends; the Commit after it
		// says so.
		return nil, fmt.Errorf("commit: %w", sql.ErrTxDone)
	}
	time.Sleep(50 * time.Millisecond) // let the connection's close reach the server
	return s.Store.CreateMany(context.WithoutCancel(ctx), nl, in)
}

// TestClientHangsUpMidBulk: a client that goes away while its bulk create runs ends as 499 in
// the access log and the metrics, not as a 500 or 503; nothing is logged as an error, and the
// answer is written at most once (no "superfluous response.WriteHeader call" from net/http).
func TestClientHangsUpMidBulk(t *testing.T) {
	for _, commit := range []bool{false, true} {
		t.Run(fmt.Sprintf("committed=%v", commit), func(t *testing.T) {
			e := newEnv(t)
			store := &hangupStore{Store: e.store, commitAnyway: commit, entered: make(chan struct{})}
			logs := e.logs
			e.srv = api.New(api.Config{Store: store, Auth: e.auth, Metrics: e.metrics,
				Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			serverLog := &logbuf.Buffer{}
			srv := httptest.NewUnstartedServer(e.srv)
			srv.Config.ErrorLog = log.New(serverLog, "", 0)
			srv.Start()

			var items []string
			for i := range 100 {
				items = append(items, fmt.Sprintf(`{"email":"user%d@example.com","name":"%s"}`, i, strings.Repeat("n", 200)))
			}
			ctx, cancel := context.WithCancel(context.Background())
			r, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+subs+"/bulk", strings.NewReader("["+strings.Join(items, ",")+"]"))
			r.Header.Set("Authorization", "Bearer "+keyA)
			done := make(chan error, 1)
			go func() {
				res, err := srv.Client().Do(r)
				if err == nil {
					res.Body.Close()
				}
				done <- err
			}()
			select {
			case <-store.entered:
			case <-time.After(5 * time.Second):
				t.Fatal("the bulk create never reached the store")
			}
			cancel() // the client hangs up mid-bulk
			if err := <-done; err == nil {
				t.Fatal("the request succeeded; want it cancelled")
			}
			// Closing waits for the handler to return.
			srv.Close()

			got := e.metrics.observed
			if want := []observation{{"POST", subs + "/bulk", api.StatusClientClosed}}; !slices.Equal(got, want) {
				t.Errorf("observed %v; want %v", got, want)
			}
			if !strings.Contains(logs.String(), `"status":499`) {
				t.Errorf("access log lacks status 499:\n%s", logs)
			}
			for _, bad := range []string{`"level":"ERROR"`, `"level":"WARN"`, `"status":500`, `"status":503`} {
				if strings.Contains(logs.String(), bad) {
					t.Errorf("log holds %s:\n%s", bad, logs)
				}
			}
			if strings.Contains(serverLog.String(), "superfluous") {
				t.Errorf("net/http logged %q", serverLog)
			}
		})
	}
}

// TestClientGoneWithoutAnswer: a handler that answers nothing because its client is gone ends
// as 499 in the metrics, and the status goes out once for the layers outside to see.
func TestClientGoneWithoutAnswer(t *testing.T) {
	e := newEnv(t)
	e.srv.Handle("GET /quiet", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	e.srv.ServeHTTP(rec, newRequest(req{"GET", "/quiet", nil, nil}).WithContext(ctx))
	if rec.Code != api.StatusClientClosed {
		t.Errorf("status written %d; want 499", rec.Code)
	}
	if want := []observation{{"GET", "/quiet", api.StatusClientClosed}}; !slices.Equal(e.metrics.observed, want) {
		t.Errorf("observed %v; want %v", e.metrics.observed, want)
	}
}
