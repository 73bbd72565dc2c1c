package main

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// otlpSink is the OTLP/HTTP trace receiver of -otlp-sink, which the exporting instances of the
// telemetry comparison send their spans to. It answers each export as a collector answers a
// fully accepted one (200, application/x-protobuf, an empty body) and decodes nothing, since it
// shares the machine's two cores with the service: it counts the exports and their bytes, so
// the report can show that the export ran.
type otlpSink struct {
	srv   *http.Server
	addr  string
	posts atomic.Int64
	bytes atomic.Int64
	last  atomic.Int64 // unix nanoseconds of the last export received
	done  chan struct{}
}

// otlpTracesPath is the OTLP/HTTP path of trace exports.
const otlpTracesPath = "/v1/traces"

// startSink listens on addr and serves exports until Close.
func startSink(addr string) (*otlpSink, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &otlpSink{addr: ln.Addr().String(), done: make(chan struct{})}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

func (s *otlpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != otlpTracesPath {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	n, err := io.Copy(io.Discard, r.Body)
	s.bytes.Add(n)
	if err != nil {
		http.Error(w, "reading the export: "+err.Error(), http.StatusBadRequest)
		return
	}
	s.posts.Add(1)
	s.last.Store(time.Now().UnixNano())
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

// Posts and Bytes are the exports received so far and their bytes (as sent).
func (s *otlpSink) Posts() int64 { return s.posts.Load() }
func (s *otlpSink) Bytes() int64 { return s.bytes.Load() }

// waitExportAfter waits, at most limit, until an export arrives that was received after t: the
// exporter sends what is left of a batch on a timer (5 s by default).
func (s *otlpSink) waitExportAfter(ctx context.Context, t time.Time, limit time.Duration) bool {
	for deadline := time.Now().Add(limit); s.last.Load() <= t.UnixNano(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
	}
	return true
}

// Close stops the sink, waiting a little for an export in flight.
func (s *otlpSink) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	<-s.done
	if errors.Is(err, context.DeadlineExceeded) {
		return s.srv.Close()
	}
	return err
}
