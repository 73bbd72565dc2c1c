package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// TestConcurrentRequests runs mixed requests with several keys at once; under -race it checks
// that the key cache and the middleware share no state unsafely.
func TestConcurrentRequests(t *testing.T) {
	e := newEnv(t)
	const workers, each = 8, 10
	var wg sync.WaitGroup
	errs := make(chan string, workers*each)
	for w := range workers {
		wg.Go(func() {
			key := []string{keyA, keyB, keyNoAccess, keyUnknown}[w%4]
			want := []int{http.StatusCreated, http.StatusCreated, http.StatusForbidden, http.StatusUnauthorized}[w%4]
			for i := range each {
				body := fmt.Sprintf(`{"email":"w%d-%d@example.com"}`, w, i)
				rec := e.do(t, req{"POST", subs, strings.NewReader(body), []string{bearer(key)}})
				if rec.Code != want {
					errs <- fmt.Sprintf("worker %d create: status %d; want %d", w, rec.Code, want)
				}
				rec = e.do(t, req{"GET", subs + "?limit=1", nil, []string{bearer(key)}})
				if want == http.StatusCreated && rec.Code != http.StatusOK {
					errs <- fmt.Sprintf("worker %d list: status %d; want 200", w, rec.Code)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for msg := range errs {
		t.Error(msg)
	}
	if n := len(e.store.created()); n != workers/2*each {
		t.Errorf("store created %d subscribers; want %d", n, workers/2*each)
	}
}

// TestCanceledRequest: a store error caused by the client going away is not reported as a
// server fault (500) but as 499; the same error with a live request is one.
func TestCanceledRequest(t *testing.T) {
	tests := []struct {
		name   string
		cancel bool
		want   int
	}{
		{"client gone", true, 499},
		{"client still there", false, http.StatusInternalServerError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.store.err = fmt.Errorf("query: %w", context.Canceled)
			ctx, cancel := context.WithCancel(context.Background())
			if tt.cancel {
				cancel()
			} else {
				defer cancel()
			}
			r := newRequest(req{"GET", subs, nil, []string{bearer(keyA)}}).WithContext(ctx)
			rec := newRecorder()
			e.srv.ServeHTTP(rec, r)
			if rec.Code != tt.want {
				t.Errorf("status %d, body %s; want %d", rec.Code, rec.Body, tt.want)
			}
		})
	}
}
