package integration

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedClient generates a Go client with oapi-codegen from the OpenAPI document the
// service serves, and uses it as an integrator would: create, bulk with Unicode addresses,
// list, get, update, unsubscribe and a typed 422, and with version 1.1 a retry with
// Idempotency-Key, a walk by next_cursor and a lookup by address, and with 1.2 the export and
// erasure of a subscriber (testdata/oapiclient/client_test.go).
//
// The generator is pinned as a tool of testdata/oapiclient/go.mod (with its go.sum), a module
// of its own copied into a temporary directory, so the service's module does not depend on
// it. oapi-codegen reads OpenAPI 3.0: it is given the 3.0 rendering Huma serves next to the
// 3.1 document (/api/v1/openapi-3.0.yaml).
func TestGeneratedClient(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs a generated client")
	}
	// Not parallel: its database pool stays open through two builds of several seconds, and
	// beside the parallel tests' pools it took the PostgreSQL server past max_connections.
	e := newEnv(t)
	res, err := http.Get(e.base + "/openapi-3.0.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET openapi-3.0.yaml: %d, %v", res.StatusCode, err)
	}

	dir := t.TempDir()
	for _, f := range []string{"go.mod", "go.sum", "oapi-codegen.yaml", "client_test.go"} {
		b, err := os.ReadFile(filepath.Join("testdata", "oapiclient", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "openapi.yaml"), spec, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(env []string, args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), append([]string{"GOWORK=off", "GOFLAGS=-mod=readonly"}, env...)...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
	run(nil, "tool", "oapi-codegen", "-config", "oapi-codegen.yaml", "openapi.yaml")
	out := run([]string{"SUBSCRIBERD_URL=" + e.srv.URL, "SUBSCRIBERD_KEY=" + e.key}, "test", "-count=1", "-v", ".")
	if !strings.Contains(out, "--- PASS: TestClient") {
		t.Fatalf("the generated client's test did not run:\n%s", out)
	}
}
