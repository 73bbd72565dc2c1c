package integration

import (
	"bufio"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/internal/logbuf"
	"github.com/subscriberd/subscriberd/repo"
)

// TestSlowBodyPastReadTimeout: a client still sending its body when the server's read timeout
// ends gets 408 request_timeout in the envelope (docs/api-contract.md §17), and the request is
// observed as 408, the server's timeout, not as 499, a client that left. Nothing is created.
// On both stores; create (preflight reads the body) and an idempotent delete (the
// Idempotency-Key check reads it).
func TestSlowBodyPastReadTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.do("POST", "/subscribers", map[string]any{"email": "slow@example.com"}).want(t, http.StatusCreated, "").data(t)["id"].(string)
	logs, serverLog, metrics := &logbuf.Buffer{}, &logbuf.Buffer{}, &statusCodes{}
	h := api.New(api.Config{
		Store: repo.NewSubscribers(e.db), Auth: e.accounts, Metrics: metrics, Idempotency: api.IdempotencyOf(e.idem),
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	srv := httptest.NewUnstartedServer(recordTraffic(h))
	srv.Config.ReadTimeout = 700 * time.Millisecond
	srv.Config.ErrorLog = log.New(serverLog, "", 0)
	srv.Start()
	defer srv.Close()

	for _, c := range []struct{ method, path, header string }{
		{"POST", api.BasePath + "/subscribers", ""},
		{"DELETE", api.BasePath + "/subscribers/" + id, "Idempotency-Key: slow-1\r\n"},
	} {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		body := `{"email":"late@example.com"}`
		fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s",
			c.method, c.path, e.key, c.header, len(body), body[:5])
		// The rest never comes before the read timeout; the client is still there, reading.
		conn.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: reading the answer: %v", c.method, err)
		}
		raw, _ := io.ReadAll(res.Body)
		res.Body.Close()
		conn.Close()
		want := `{"success":false,"code":"request_timeout","message":"The request body took too long to arrive."}`
		if res.StatusCode != http.StatusRequestTimeout || strings.TrimSpace(string(raw)) != want {
			t.Errorf("%s: %d %s; want 408 %s", c.method, res.StatusCode, raw, want)
		}
	}
	srv.Close()
	metrics.mu.Lock()
	got := fmt.Sprint(metrics.codes)
	metrics.mu.Unlock()
	if got != "[408 408]" {
		t.Errorf("observed statuses %s; want [408 408]", got)
	}
	if !strings.Contains(logs.String(), `"status":408`) || strings.Contains(logs.String(), `"status":499`) {
		t.Errorf("access log:\n%s", logs)
	}
	if s := serverLog.String(); s != "" {
		t.Errorf("net/http logged %q", s)
	}
	if n := e.count("SELECT count(*) FROM subscribers WHERE status = 'unsubscribed' OR email = 'late@example.com'"); n != 0 {
		t.Errorf("%d subscribers changed by requests that timed out; want 0", n)
	}
}
