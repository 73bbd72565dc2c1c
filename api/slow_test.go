package api_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/model"
)

// slowStore takes longer than Huma's default 5 s body-read deadline to create a subscriber.
type slowStore struct {
	api.Store
	delay time.Duration
}

func (s slowStore) Create(ctx context.Context, nl uuid.UUID, in model.NewSubscriber) (model.Subscriber, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return model.Subscriber{}, ctx.Err()
	}
	return s.Store.Create(ctx, nl, in)
}

// A request slower than 5 s used to leave Huma's body-read deadline on the connection: when it
// fired, net/http cancelled the connection's context, the slow request answered 500 and every
// later request on that keep-alive connection 503. Bodies are read by preflight, so the
// operations clear that deadline.
func TestSlowRequestKeepsItsConnection(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv = api.New(api.Config{Store: slowStore{Store: e.store, delay: 5500 * time.Millisecond}, Auth: e.auth})
	srv := httptest.NewServer(e.srv)
	defer srv.Close()
	key := keyA
	client := srv.Client() // one keep-alive connection, reused
	post := func(email string) (int, string) {
		req, _ := http.NewRequest("POST", srv.URL+"/api/v1/subscribers", strings.NewReader(`{"email":"`+email+`"}`))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, body := post("slow@example.com"); code != http.StatusCreated {
		t.Fatalf("slow create = %d %s, want 201", code, body)
	}
	req, _ := http.NewRequest("GET", srv.URL+"/api/v1/subscribers", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("next request on the same connection = %d, want 200", res.StatusCode)
	}
}
