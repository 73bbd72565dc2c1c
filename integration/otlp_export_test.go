package integration

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/subscriberd/subscriberd/internal/otlptest"
	"github.com/subscriberd/subscriberd/internal/smtptest"
	"github.com/subscriberd/subscriberd/mail"
	"github.com/subscriberd/subscriberd/repo"
	"github.com/subscriberd/subscriberd/telemetry"
)

// exportingProvider builds the tracer provider serve builds from the process environment
// (telemetry.SetupTracing) and makes it the one behind the tests' global provider until the
// test ends; the returned function flushes and stops it.
func exportingProvider(t *testing.T, version string) func(context.Context) error {
	t.Helper()
	prop := otel.GetTextMapPropagator()
	shutdown, err := telemetry.SetupTracing(context.Background(), version)
	if err != nil {
		t.Fatal(err)
	}
	tp := otel.GetTracerProvider()
	// The packages' tracers delegate to the first global provider, the tests' switch.
	otel.SetTracerProvider(switchTP{})
	otel.SetTextMapPropagator(prop)
	useTracerProvider(tp)
	t.Cleanup(func() {
		useTracerProvider(recordingTP)
		shutdown(context.Background()) //nolint:errcheck // stopped already when the test passed
	})
	return shutdown
}

// TestOTLPExportOverBothProtocols: what the span tests see in process reaches a real receiver
// over OTLP/HTTP and over OTLP/gRPC, through the official exporter SetupTracing picks from
// OTEL_EXPORTER_OTLP_PROTOCOL: a create's server span with its route, auth event and INSERT
// span under it; the email.send span linked to that request; the confirmation page's span
// with the token cut from url.path; and nowhere the key, the email, the token or a client
// address.
func TestOTLPExportOverBothProtocols(t *testing.T) {
	rcv := otlptest.Start(t)
	for _, c := range []struct{ protocol, endpoint string }{{"http/protobuf", rcv.HTTPURL}, {"grpc", rcv.GRPCURL}} {
		t.Run(strings.ReplaceAll(c.protocol, "/", "_"), func(t *testing.T) {
			o := newObserved(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.endpoint)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", c.protocol)
			t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
			version := "itest-" + strings.ReplaceAll(c.protocol, "/", "-")
			shutdown := exportingProvider(t, version)

			email := "otlp-" + strings.ReplaceAll(c.protocol, "/", "-") + "@example.com"
			o.do("POST", "/subscribers", map[string]any{"email": email, "status": "pending"}).want(t, http.StatusCreated, "")
			catcher := smtptest.Start(t)
			tr, err := mail.NewSMTP(catcher.URL(), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			composer, err := mail.NewComposer(testFrom, "http://subscriberd.test")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := mail.NewWorker(repo.NewOutbox(o.db), tr, composer, testWorkerConfig()).RunOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			msgs := catcher.Messages()
			if len(msgs) != 1 || msgs[0].Token() == "" {
				t.Fatalf("got %d messages, want one with a link", len(msgs))
			}
			token := msgs[0].Token()
			if r := o.do("GET", o.srv.URL+"/confirm/"+token, nil); r.status != http.StatusOK {
				t.Fatalf("GET link = %d", r.status)
			}
			if err := shutdown(context.Background()); err != nil { // flushes the batch
				t.Fatal(err)
			}

			byName := map[string]otlptest.Span{}
			var got []otlptest.Span
			for _, s := range rcv.Spans() {
				if s.Resource["service.version"] != version {
					continue
				}
				if s.Protocol != c.protocol {
					t.Errorf("span %q arrived over %s", s.Name, s.Protocol)
				}
				got = append(got, s)
				byName[s.Name] = s
			}
			create, ok := byName["POST /api/v1/subscribers"]
			if !ok {
				t.Fatalf("no create span among %d received", len(got))
			}
			if create.Attrs["http.route"] != "/api/v1/subscribers" || create.Attrs["http.response.status_code"] != "201" ||
				!slices.Contains(create.Events, "auth") || create.Resource["service.name"] != telemetry.ServiceName {
				t.Errorf("create span %+v", create)
			}
			if ins, ok := byName["INSERT subscribers"]; !ok || ins.Parent != create.SpanID || ins.TraceID != create.TraceID {
				t.Errorf("INSERT subscribers %+v: want it under the create span %s", ins, create.SpanID)
			}
			if send, ok := byName["email.send"]; !ok || !slices.Contains(send.Links, create.TraceID) || send.TraceID == create.TraceID {
				t.Errorf("email.send %+v: want a trace of its own linked to the create's %s", send, create.TraceID)
			}
			if page, ok := byName["GET /confirm/{token}"]; !ok || page.Attrs["url.path"] != "/confirm/{token}" {
				t.Errorf("confirmation page span %+v: want url.path /confirm/{token}", page)
			}
			for _, s := range got {
				for k, v := range s.Attrs {
					if strings.HasPrefix(k, "client.") || strings.HasPrefix(k, "network.peer.") ||
						strings.Contains(v, o.key) || strings.Contains(v, email) || strings.Contains(v, token) {
						t.Errorf("span %q: %s = %q", s.Name, k, v)
					}
				}
			}
		})
	}
}
