package telemetry

import "sync"

// bufPool reuses the byte buffers log lines are formatted into on the request path.
// get hands out a pointer that put takes back with what was appended, so that reuse
// allocates nothing.
type bufPool struct {
	pool    sync.Pool
	size    int // capacity of a new buffer
	maxKept int // a buffer grown past this is dropped rather than kept
}

// get returns a buffer, empty.
func (p *bufPool) get() *[]byte {
	if b, ok := p.pool.Get().(*[]byte); ok {
		*b = (*b)[:0]
		return b
	}
	b := make([]byte, 0, p.size)
	return &b
}

// put takes buf back with used, what was appended to it, unless a large record made it
// outsized.
func (p *bufPool) put(buf *[]byte, used []byte) {
	if cap(used) <= p.maxKept {
		*buf = used[:0]
		p.pool.Put(buf)
	}
}

// lineBufs holds the buffers log lines are formatted into (jsonline.go).
var lineBufs = bufPool{size: 512, maxKept: 16 << 10}
