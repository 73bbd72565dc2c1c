package main

import (
	"bufio"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/subscriberd/subscriberd/internal/otlptest"
)

// TestBinaryTraceExport starts the built binary as a newcomer would, with the OpenTelemetry
// variables of docs/api-contract.md §7, makes one request (with a B3 header from the caller)
// and looks at what comes out: spans on stdout with OTEL_TRACES_EXPORTER=console, at an OTLP
// receiver over gRPC and over HTTP, and nothing with OTEL_TRACES_EXPORTER=none.
func TestBinaryTraceExport(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "subscriberd")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	rcv := otlptest.Start(t)
	const caller = "80f198ee56343ba864fe8b2a57d3eff7"
	for _, c := range []struct {
		name     string
		env      map[string]string
		protocol string // how the span reaches rcv; "" = it does not
	}{
		{"console", map[string]string{"OTEL_TRACES_EXPORTER": "console"}, ""},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.GRPCURL, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc"},
		{"http/protobuf", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.HTTPURL, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "http/protobuf"},
		{"none", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.HTTPURL, "OTEL_TRACES_EXPORTER": "none"}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("OTEL_PROPAGATORS", "tracecontext,baggage,b3")
			t.Setenv("OTEL_SERVICE_NAME", "subscriberd-"+c.name)
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			d := startBinary(t, bin, t.TempDir(), "dev")
			base := d.api(t)
			key := devKey(t, d)
			req, _ := http.NewRequest("GET", base+"/api/v1/subscribers", nil)
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header.Set("b3", caller+"-e457b5a2e4d86bd1-1")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusOK {
				t.Fatalf("GET = %d", res.StatusCode)
			}
			before := len(rcv.Spans())
			d.stop(t) // flushes the batch
			var got *otlptest.Span
			for _, s := range rcv.Spans()[before:] {
				if s.Name == "GET /api/v1/subscribers" && s.Resource["service.name"] == "subscriberd-"+c.name {
					got = &s
				}
			}
			switch {
			case c.protocol == "" && got != nil:
				t.Errorf("a span reached the receiver over %s", got.Protocol)
			case c.protocol != "" && got == nil:
				t.Fatalf("no server span received; stderr:\n%s", d.stderr.String())
			case c.protocol != "":
				if got.Protocol != c.protocol || got.Attrs["http.route"] != "/api/v1/subscribers" || len(got.Links) != 1 || got.Links[0] != caller {
					t.Errorf("span %+v: want protocol %s, http.route and a link to the caller's B3 trace", *got, c.protocol)
				}
				for k := range got.Attrs {
					if strings.HasPrefix(k, "client.") || strings.HasPrefix(k, "network.peer.") {
						t.Errorf("span has %s", k)
					}
				}
			}
			out := d.stdout.String()
			if console := strings.Contains(out, `"Name":"GET /api/v1/subscribers"`); console != (c.name == "console") {
				t.Errorf("spans on stdout: %v; stdout:\n%s", console, out)
			}
			if c.name == "console" && !strings.Contains(out, caller) {
				t.Errorf("the console span has no link to the caller's trace; stdout:\n%s", out)
			}
		})
	}
}

// devKey waits for the API key `dev` prints.
func devKey(t *testing.T, d *daemon) string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		sc := bufio.NewScanner(strings.NewReader(d.stdout.String()))
		for sc.Scan() {
			if line := strings.TrimSpace(sc.Text()); strings.HasPrefix(line, "sk_") {
				return line
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("dev printed no key; stdout:\n%s", d.stdout.String())
		}
	}
}
