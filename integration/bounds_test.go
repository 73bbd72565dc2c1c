package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestQueryStringBombIsCheap is issue #24's CPU bomb against the real stack over HTTP:
// GET /subscribers?a0&a1&…&a9999&x=1 (59 KB, under the header limit) cost about 2.3
// CPU-seconds a request in Huma's parameter lookup. It is refused with 400 before anything
// parses it, on every route, in well under 10 ms of CPU, measured on the whole process (the
// client's side included). Not parallel, so that no other test's work is counted.
func TestQueryStringBombIsCheap(t *testing.T) {
	e := newEnv(t)
	var b strings.Builder
	for i := range 10000 {
		fmt.Fprintf(&b, "a%d&", i)
	}
	bomb := "?" + b.String() + "x=1"
	for _, path := range []string{"/subscribers", "/subscribers/01900000-0000-7000-8000-000000000001", "/openapi.json"} {
		e.do("GET", path+bomb, nil).want(t, http.StatusBadRequest, "validation_error")
	}
	const n = 50
	start := cpuTime(t)
	for range n {
		e.do("GET", "/subscribers"+bomb, nil).want(t, http.StatusBadRequest, "validation_error")
	}
	per := (cpuTime(t) - start) / n
	t.Logf("%v of CPU a bomb, client included", per)
	if per > 10*time.Millisecond {
		t.Errorf("a bomb cost %v of CPU; want well under 10 ms", per)
	}
}
