package telemetry

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the flusher goroutine and the test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	n  int // writes
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) writes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func TestLogBufferBatchesAndFlushesOnTime(t *testing.T) {
	out := &syncBuffer{}
	b := NewLogBuffer(out)
	defer b.Close()
	log, err := NewLogger(b, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		log.Info("request", "status", 200)
	}
	if got := out.String(); got != "" {
		t.Fatalf("info lines were written at once, not batched: %q", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(out.String(), "\n") < 50 {
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s, %d of 50 lines were written", strings.Count(out.String(), "\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := out.writes(); n > 5 {
		t.Errorf("50 lines took %d writes; they should be batched", n)
	}
}

func TestLogBufferWarnFlushesAtOnce(t *testing.T) {
	out := &syncBuffer{}
	b := NewLogBuffer(out)
	defer b.Close()
	log, _ := NewLogger(b, "info", "json")
	log.Info("before")
	log.With("component", "worker").WarnContext(context.Background(), "smtp down")
	got := out.String()
	if !strings.Contains(got, `"msg":"before"`) || !strings.Contains(got, `"msg":"smtp down"`) {
		t.Fatalf("a warning must be written at once, with what was logged before it; got %q", got)
	}
}

func TestLogBufferCloseFlushesThenWritesThrough(t *testing.T) {
	out := &syncBuffer{}
	b := NewLogBuffer(out)
	b.Write([]byte("one\n"))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "one\n" {
		t.Fatalf("Close did not flush: %q", got)
	}
	b.Write([]byte("two\n"))
	if got := out.String(); got != "one\ntwo\n" {
		t.Fatalf("a write after Close was not written through: %q", got)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestLogBufferKeepsLinesWhole(t *testing.T) {
	out := &syncBuffer{}
	b := NewLogBuffer(out)
	big := strings.Repeat("x", LogBufferSize+10) + "\n"
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 500 {
				line := strings.Repeat(string(rune('a'+i)), 100+i*37) + "\n"
				if i == 0 {
					line = big
				}
				b.Write([]byte(line))
			}
		})
	}
	wg.Wait()
	b.Close()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 8*500 {
		t.Fatalf("%d lines, want %d", len(lines), 8*500)
	}
	for _, l := range lines {
		if l != strings.Repeat(l[:1], len(l)) {
			t.Fatalf("a line was cut or mixed with another: %.60q…", l)
		}
	}
}
