package api_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/api"
)

// bombQuery is the query of issue #24: ten thousand names, then one with a value (59 KB).
func bombQuery(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "a%d&", i)
	}
	b.WriteString("x=1")
	return b.String()
}

// TestQueryStringBounds: a query over MaxQueryBytes or MaxQueryParams is refused with 400
// before anything reads it — before the key is looked at (no lookup, no 401 without a key) and
// so before Huma, whose middlewares run first, parses a parameter.
func TestQueryStringBounds(t *testing.T) {
	atParams := strings.Repeat("a&", api.MaxQueryParams-1) + "limit=5"
	atBytes := "limit=5&pad=" + strings.Repeat("x", api.MaxQueryBytes-len("limit=5&pad="))
	tests := []struct {
		name, query string
		want        int
		msg         string
	}{
		{"bomb", bombQuery(10000), 400, "The query string must not be longer than 2048 bytes."},
		{"too many parameters", atParams + "&b", 400, "The query string must not have more than 32 parameters."},
		{"too long", atBytes + "x", 400, "The query string must not be longer than 2048 bytes."},
		{"parameters at the limit", atParams, 200, ""},
		{"length at the limit", atBytes, 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			rec := e.call(t, "GET", subs+"?"+tt.query, "")
			if rec.Code != tt.want {
				t.Fatalf("status %d, body %s; want %d", rec.Code, rec.Body, tt.want)
			}
			if tt.want == 200 {
				return
			}
			wantEnvelope(t, rec, "validation_error", tt.msg)
			if n := e.auth.Lookups(); n != 0 {
				t.Errorf("key looked up %d times; want the query refused first", n)
			}
			if calls := e.store.Calls(); len(calls) != 0 {
				t.Errorf("store called: %v", calls)
			}
			// Without a key the answer is still 400, not 401: nothing of Huma ran.
			if rec := e.do(t, req{"GET", subs + "?" + tt.query, nil, nil}); rec.Code != http.StatusBadRequest {
				t.Errorf("without a key: status %d; want 400", rec.Code)
			}
		})
	}
}

// TestQueryStringBombIsCheap: refusing the bomb reads its bytes once and parses nothing, so it
// allocates what any request does (parsing the 10,001 names would allocate tens of thousands
// of objects and, in Huma, take about two CPU-seconds). BenchmarkQueryStringBomb measures it.
func TestQueryStringBombIsCheap(t *testing.T) {
	e := newEnv(t)
	r := newRequest(req{"GET", subs + "?" + bombQuery(10000), nil, []string{bearer(keyA)}})
	allocs := testing.AllocsPerRun(20, func() {
		rec := httptest.NewRecorder()
		e.srv.ServeHTTP(rec, r)
		if rec.Code != http.StatusBadRequest {
			t.Fatalf("status %d; want 400", rec.Code)
		}
	})
	if allocs > 100 {
		t.Errorf("refusing the bomb allocated %.0f objects; want under 100 (nothing parsed)", allocs)
	}
}

func BenchmarkQueryStringBomb(b *testing.B) {
	e := newEnv(b)
	r := newRequest(req{"GET", subs + "?" + bombQuery(10000), nil, []string{bearer(keyA)}})
	b.ReportAllocs()
	for b.Loop() {
		e.srv.ServeHTTP(httptest.NewRecorder(), r)
	}
}

// TestUncleanPathsAnswerJSON404: the mux would redirect these to their cleaned form with an
// HTML 307; the API answers the JSON 404 envelope, for every method.
func TestUncleanPathsAnswerJSON404(t *testing.T) {
	e := newEnv(t)
	for _, p := range []string{
		"/api/v1//subscribers",
		"/api/v1/./subscribers",
		"/api/v1/./x",
		"/api/v1/x/../subscribers",
		"//api/v1/subscribers",
		"/api/v1/subscribers/./01900000-0000-7000-8000-000000000001",
	} {
		for _, m := range []string{"GET", "POST", "DELETE"} {
			rec := e.call(t, m, p, "")
			if rec.Code != http.StatusNotFound || rec.Header().Get("Location") != "" {
				t.Errorf("%s %s: status %d, Location %q; want 404 without a redirect", m, p, rec.Code, rec.Header().Get("Location"))
				continue
			}
			wantEnvelope(t, rec, "not_found", api.MsgRouteNotFound)
		}
	}
	if calls := e.store.Calls(); len(calls) != 0 {
		t.Errorf("store called: %v", calls)
	}
}

// wantEnvelope checks an error envelope's code and message.
func wantEnvelope(t *testing.T, rec *httptest.ResponseRecorder, code, msg string) {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q; want application/json", ct)
	}
	body := decode(t, rec)
	if body["success"] != false || body["code"] != code || body["message"] != msg {
		t.Errorf("body %s; want code %q, message %q", rec.Body, code, msg)
	}
}

// rawExchange sends head (a request without its body, or with part of it) over a new TCP
// connection to srv and returns the first status line, the whole response as read until the
// server closed the connection, and how long that took.
func rawExchange(t *testing.T, srv *httptest.Server, head string) (status, all string, closedAfter time.Duration) {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	conn.SetDeadline(start.Add(5 * time.Second)) //nolint:errcheck
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	status, err = br.ReadString('\n')
	if err != nil {
		t.Fatalf("reading the status line: %v", err)
	}
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("the server kept the connection open (%v after %v); want it closed after the answer", err, time.Since(start))
	}
	return strings.TrimSpace(status), status + string(rest), time.Since(start)
}

// TestDeclaredBodyOver1MiB: a declared Content-Length over 1 MiB gets 413 at once, over a
// real connection: without "100 Continue" when the client asked for it (so it uploads
// nothing), without waiting for a body that is not sent, and the connection is closed rather
// than held until the read timeout.
func TestDeclaredBodyOver1MiB(t *testing.T) {
	e := newEnv(t)
	srv := httptest.NewServer(e.srv)
	defer srv.Close()
	for _, tt := range []struct{ name, extra string }{
		{"expect 100-continue", "Expect: 100-continue\r\n"},
		{"no expect, body never sent", ""},
		{"no key", "Expect: 100-continue\r\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			auth := "Authorization: Bearer " + keyA + "\r\n"
			if tt.name == "no key" {
				auth = ""
			}
			head := "POST /api/v1/subscribers/bulk HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + auth +
				fmt.Sprintf("Content-Length: %d\r\n", api.MaxBodyBytes+1) + tt.extra + "\r\n"
			status, all, took := rawExchange(t, srv, head)
			if status != "HTTP/1.1 413 Request Entity Too Large" {
				t.Fatalf("first line %q; want 413 at once (no 100 Continue)\n%s", status, all)
			}
			if !strings.Contains(all, `"code":"payload_too_large"`) {
				t.Errorf("response %q; want the payload_too_large envelope", all)
			}
			if took > 2*time.Second {
				t.Errorf("connection closed after %v; want at once", took)
			}
		})
	}
	if calls := e.store.Calls(); len(calls) != 0 {
		t.Errorf("store called: %v", calls)
	}
	// At the limit the body is read as usual (after 100 Continue when asked).
	status, _, _ := rawExchange(t, srv, "POST /api/v1/subscribers HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"+
		"Authorization: Bearer "+keyA+"\r\nContent-Length: 20\r\nExpect: 100-continue\r\n\r\n"+`{"email":"a@b.io"}  `)
	if status != "HTTP/1.1 100 Continue" {
		t.Errorf("small body with Expect: first line %q; want 100 Continue", status)
	}
}

// TestMalformedEscapesAreTakenLiterally: a "%" that starts no escape is part of the value, so
// a parameter with one is judged by its own rule rather than skipped as if it were absent (a
// lookup by email that listed every subscriber, a status filter that did not filter).
func TestMalformedEscapesAreTakenLiterally(t *testing.T) {
	e := newEnv(t)
	e.create(t, keyA, `{"email":"ann@example.com"}`)
	e.create(t, keyA, `{"email":"bob@example.com","status":"pending"}`)
	for _, tt := range []struct{ query, msg string }{
		{"email=ann%40example.com%zz", "The email filter must be a valid email address."},
		{"email=ann%40example.com%", "The email filter must be a valid email address."},
		{"status=%zz", "The status filter must be one of: active, pending, unsubscribed."},
		{"status=active%2", "The status filter must be one of: active, pending, unsubscribed."},
		{"page=%zz", "The page parameter must be an integer greater than or equal to 1."},
		{"limit=1%", "The limit parameter must be an integer between 1 and 100."},
		{"cursor=%zz", api.MsgCursorInvalid},
	} {
		rec := e.call(t, "GET", subs+"?"+tt.query, "")
		if rec.Code != http.StatusBadRequest {
			t.Errorf("?%s: status %d, body %s; want 400", tt.query, rec.Code, rec.Body)
			continue
		}
		wantEnvelope(t, rec, "validation_error", tt.msg)
	}
	// Taken literally, an address with a stray "%" is one nobody has; an unknown parameter
	// with one is ignored like any other; good escapes around a bad one still decode.
	for query, want := range map[string]int{
		"email=ann%zz%40example.com":     0,
		"utm=%zz&status=pending":         1,
		"email=%41nn%40example.com&x=%g": 1,
	} {
		rec := e.call(t, "GET", subs+"?"+query, "")
		var env struct {
			Pagination struct{ Total int }
		}
		decodeInto(t, rec, &env)
		if rec.Code != http.StatusOK || env.Pagination.Total != want {
			t.Errorf("?%s: status %d, body %s; want 200 with total %d", query, rec.Code, rec.Body, want)
		}
	}
}
