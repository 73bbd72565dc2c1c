package telemetry

import (
	"io"
	"sync"
	"time"
)

// LogBuffer batches log lines on their way to w (stderr): a line is written with others when
// LogBufferSize bytes are waiting or LogFlushInterval after it was logged, whichever is first.
// One write per request (the access log) was one system call per request, about 4 µs of the
// service's CPU per request under load; batched, it is a copy.
//
// NewLogger flushes the buffer after every record at warn level or above, so warnings and
// errors are written at once; what a crash can lose is the last LogFlushInterval of info
// lines. Close flushes and makes later writes go straight to w.
type LogBuffer struct {
	mu     sync.Mutex
	w      io.Writer
	buf    []byte
	closed bool
	stop   chan struct{}
	done   chan struct{}
}

// LogBufferSize and LogFlushInterval bound what the buffer holds back.
const (
	LogBufferSize    = 32 << 10
	LogFlushInterval = 100 * time.Millisecond
)

// NewLogBuffer starts a buffer in front of w; call Close when done.
func NewLogBuffer(w io.Writer) *LogBuffer {
	b := &LogBuffer{w: w, buf: make([]byte, 0, LogBufferSize), stop: make(chan struct{}), done: make(chan struct{})}
	go b.flushEvery(LogFlushInterval)
	return b
}

func (b *LogBuffer) flushEvery(d time.Duration) {
	defer close(b.done)
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			b.Flush() //nolint:errcheck // nowhere to report a failed log write
		case <-b.stop:
			return
		}
	}
}

// Write buffers p (slog writes one record per call), or writes it through once closed or when
// it is larger than the buffer.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || len(p) > LogBufferSize {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
		return b.w.Write(p)
	}
	if len(b.buf)+len(p) > LogBufferSize {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// Flush writes what is buffered.
func (b *LogBuffer) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.flushLocked()
}

func (b *LogBuffer) flushLocked() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.w.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}

// Close flushes the buffer and stops the flusher; later writes go straight to w.
func (b *LogBuffer) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	close(b.stop)
	<-b.done
	return b.Flush()
}
