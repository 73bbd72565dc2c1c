package limits

import (
	"context"
	"sync"
	"time"
)

// DefaultMaxEntries bounds a Memory backend when NewMemory is given no bound.
const DefaultMaxEntries = 1 << 20

// MaxFailureLogs bounds the failure logs among a Memory backend's entries (about 16 MB). A
// failed authentication from a new client makes one, so a client with many networks could
// otherwise fill the whole backend, past the memory limit, and leave the keys' windows no
// room. When the logs are full, a new client's failures are not counted (its lockout fails
// open); the keys' windows keep their room.
const MaxFailureLogs = 1 << 16

// sweepEvery is how often, by the backend's clock, Memory drops entries that carry no state.
const sweepEvery = time.Minute

// Memory is the in-process Backend. Entries that no longer carry state (a bucket that has
// refilled, a failure log whose newest failure left the window, a lock that ended) are
// dropped at least every minute, so memory follows the recently active subjects. It never
// holds more than a fixed number of entries: when full, a new subject is decided as fresh
// and not remembered — the limiter fails open rather than growing without bound.
type Memory struct {
	now func() time.Time
	max int
	// maxLogs bounds the failure logs within max (MaxFailureLogs, or max when smaller).
	maxLogs int

	mu        sync.Mutex
	tats      map[string]int64   // bucket key → theoretical arrival time (µs); stale when ≤ now
	logs      map[string][]int64 // failure log key → failure times (µs), newest first
	locks     map[string]int64   // lock key → end (µs); stale when ≤ now
	logWindow map[string]int64   // failure log key → its rule's window (µs), for sweeping
	nextSweep int64
	// nextFullSweep is when a full backend may sweep again (µs): a flood of new subjects must
	// not scan every entry on each request.
	nextFullSweep int64
}

// NewMemory returns an in-process backend reading time from now (time.Now when nil) and
// holding at most maxEntries entries (DefaultMaxEntries when ≤ 0).
func NewMemory(now func() time.Time, maxEntries int) *Memory {
	if now == nil {
		now = time.Now
	}
	if maxEntries <= 0 {
		maxEntries = DefaultMaxEntries
	}
	return &Memory{
		now: now, max: maxEntries, maxLogs: min(MaxFailureLogs, maxEntries),
		tats: map[string]int64{}, logs: map[string][]int64{}, locks: map[string]int64{}, logWindow: map[string]int64{},
	}
}

// Name returns "memory".
func (m *Memory) Name() string { return "memory" }

// Ping always succeeds.
func (m *Memory) Ping(context.Context) error { return nil }

// Len reports how many entries the backend holds.
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.len()
}

func (m *Memory) len() int { return len(m.tats) + len(m.logs) + len(m.locks) }

// Take implements Backend.
func (m *Memory) Take(_ context.Context, lockKey string, buckets []Bucket) (Outcome, error) {
	now := m.now().UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.maybeSweep(now)
	if end := m.locks[lockKey]; end > now {
		return Outcome{Locked: us(end - now), Backend: m.Name()}, nil
	}
	out := Outcome{Allowed: true, Windows: make([]WindowState, len(buckets)), Backend: m.Name()}
	var nextBuf [8]int64
	next := nextBuf[:0]
	for i, b := range buckets {
		n, st := gcra(now, m.tats[b.Key], b.Window)
		out.Windows[i] = st
		out.Allowed = out.Allowed && st.Allowed
		next = append(next, n)
	}
	if !out.Allowed {
		return out, nil
	}
	for i, b := range buckets {
		if _, ok := m.tats[b.Key]; ok || m.room(now) {
			m.tats[b.Key] = next[i]
		}
	}
	return out, nil
}

// LockedFor implements Backend.
func (m *Memory) LockedFor(_ context.Context, lockKey string) (time.Duration, error) {
	now := m.now().UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	if end := m.locks[lockKey]; end > now {
		return us(end - now), nil
	}
	return 0, nil
}

// Fail implements Backend.
func (m *Memory) Fail(_ context.Context, logKey, lockKey string, rule Lockout) (bool, time.Duration, error) {
	now := m.now().UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.maybeSweep(now)
	if end := m.locks[lockKey]; end > now {
		return false, us(end - now), nil
	}
	log, ok := m.logs[logKey]
	if !ok && !m.logRoom(now) {
		return false, 0, nil
	}
	// Newest first, at most rule.Failures long: the same shape as the Redis list.
	if len(log) < rule.Failures {
		log = append(log, 0)
	}
	copy(log[1:], log)
	log[0] = now
	if lockoutTrips(now, log, rule) {
		delete(m.logs, logKey)
		delete(m.logWindow, logKey)
		if _, ok := m.locks[lockKey]; ok || m.room(now) {
			m.locks[lockKey] = now + rule.Lock.Microseconds()
		}
		return true, 0, nil
	}
	m.logs[logKey] = log
	m.logWindow[logKey] = rule.Window.Microseconds()
	return false, 0, nil
}

// room reports whether one more entry fits, sweeping first when the backend is full.
func (m *Memory) room(now int64) bool {
	return m.len() < m.max || m.sweepFull(now) && m.len() < m.max
}

// logRoom reports whether one more failure log fits, in the logs' quota and in the bound.
func (m *Memory) logRoom(now int64) bool {
	fits := len(m.logs) < m.maxLogs || m.sweepFull(now) && len(m.logs) < m.maxLogs
	return fits && m.room(now)
}

// sweepFull sweeps a full backend (or a full quota) and reports whether it did: at most once a
// second, so that a flood of new subjects does not scan every entry on each request.
func (m *Memory) sweepFull(now int64) bool {
	if now < m.nextFullSweep {
		return false
	}
	m.nextFullSweep = now + time.Second.Microseconds()
	m.sweep(now)
	return true
}

func (m *Memory) maybeSweep(now int64) {
	if now < m.nextSweep {
		return
	}
	m.sweep(now)
}

// sweep drops every entry that no longer carries state: such an entry answers exactly as an
// absent one.
func (m *Memory) sweep(now int64) {
	m.nextSweep = now + sweepEvery.Microseconds()
	for k, tat := range m.tats {
		if tat <= now {
			delete(m.tats, k)
		}
	}
	for k, end := range m.locks {
		if end <= now {
			delete(m.locks, k)
		}
	}
	for k, log := range m.logs {
		if now-log[0] >= m.logWindow[k] {
			delete(m.logs, k)
			delete(m.logWindow, k)
		}
	}
}
