package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// receiver reads what it is sent, throws it away and counts it, decoding nothing (it shares the
// machine's cores with the service): the webhook receiver, and the OTLP/HTTP trace sink of
// -otlp-sink that the exporting instances of the telemetry comparison send their spans to.
type receiver struct {
	srv   *http.Server
	addr  string
	url   string // the webhook endpoint's URL
	n     atomic.Int64
	bytes atomic.Int64
	last  atomic.Int64 // Unix nanoseconds of the last request counted
	done  chan struct{}
}

// otlpTracesPath is the OTLP/HTTP path of trace exports.
const otlpTracesPath = "/v1/traces"

// startReceiver serves the webhook receiver on addr until Close.
func startReceiver(addr string) (*receiver, error) {
	rc, err := serve(addr, func(w http.ResponseWriter, _ *http.Request) bool {
		w.WriteHeader(http.StatusNoContent)
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("-webhook-receiver: %w", err)
	}
	return rc, nil
}

// startSink serves the OTLP sink on addr until Close: it answers a POST to /v1/traces as a
// collector answers a fully accepted export (200, application/x-protobuf, an empty body) and
// refuses anything else uncounted.
func startSink(addr string) (*receiver, error) {
	return serve(addr, func(w http.ResponseWriter, r *http.Request) bool {
		switch {
		case r.URL.Path != otlpTracesPath:
			http.NotFound(w, r)
		case r.Method != http.MethodPost:
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		default:
			w.Header().Set("Content-Type", "application/x-protobuf")
			w.WriteHeader(http.StatusOK)
			return true
		}
		return false
	})
}

// serve listens on addr and answers each request with answer, counting those it accepts.
func serve(addr string, answer func(http.ResponseWriter, *http.Request) bool) (*receiver, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	rc := &receiver{addr: ln.Addr().String(), done: make(chan struct{})}
	rc.url = "http://" + rc.addr + "/hook"
	rc.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, err := io.Copy(io.Discard, r.Body)
			if err != nil {
				http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
				return
			}
			if answer(w, r) {
				rc.bytes.Add(n)
				rc.n.Add(1)
				rc.last.Store(time.Now().UnixNano())
			}
		})}
	go func() {
		defer close(rc.done)
		_ = rc.srv.Serve(ln)
	}()
	return rc, nil
}

// Posts and Bytes are the requests counted so far and their bytes (as sent: compressed when
// the exporter compresses).
func (rc *receiver) Posts() int64 { return rc.n.Load() }
func (rc *receiver) Bytes() int64 { return rc.bytes.Load() }

// waitExportAfter waits, at most limit, until a request arrives that was received after t: the
// exporter sends what is left of a batch on a timer (5 s by default).
func (rc *receiver) waitExportAfter(ctx context.Context, t time.Time, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for rc.last.Load() <= t.UnixNano() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// Close stops the receiver, waiting a little for a request in flight.
func (rc *receiver) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := rc.srv.Shutdown(ctx)
	<-rc.done
	if errors.Is(err, context.DeadlineExceeded) {
		return rc.srv.Close()
	}
	return err
}
