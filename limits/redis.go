package limits

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultRedisPrefix starts every key the Redis backend writes.
const DefaultRedisPrefix = "subscriberd:limits:"

// RedisOptions parses a REDIS_URL (redis:// or rediss://) into client options with short
// timeouts that follow the request's context, so an unreachable Redis costs a request
// milliseconds, not seconds, before the limiter decides in process. Timeouts given in the
// URL (dial_timeout, read_timeout, ...) win.
func RedisOptions(url string) (*redis.Options, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	if opt.DialTimeout == 0 {
		opt.DialTimeout = 250 * time.Millisecond
	}
	if opt.ReadTimeout == 0 {
		opt.ReadTimeout = 250 * time.Millisecond
	}
	if opt.WriteTimeout == 0 {
		opt.WriteTimeout = 250 * time.Millisecond
	}
	opt.ContextTimeoutEnabled = true
	// One attempt: a retry against a Redis that is down only delays the fallback.
	opt.MaxRetries = -1
	opt.DialerRetries = 1
	return opt, nil
}

// Redis is the Backend that shares counters between instances through Redis. Each call is
// one round trip running one Lua script, so a decision over every window of a request is
// atomic. Time comes from the Redis server (one clock for every instance) unless an
// explicit clock is given.
type Redis struct {
	rdb    redis.Scripter
	prefix string
	now    func() time.Time // nil: the Redis server's TIME
}

// NewRedis returns a backend on rdb whose keys start with prefix (DefaultRedisPrefix when
// empty). now, when not nil, replaces the server's clock (tests inject one).
func NewRedis(rdb redis.Scripter, prefix string, now func() time.Time) *Redis {
	if prefix == "" {
		prefix = DefaultRedisPrefix
	}
	return &Redis{rdb: rdb, prefix: prefix, now: now}
}

// Name returns "redis".
func (r *Redis) Name() string { return "redis" }

// Ping reports whether Redis answers.
func (r *Redis) Ping(ctx context.Context) error {
	if p, ok := r.rdb.(interface {
		Ping(context.Context) *redis.StatusCmd
	}); ok {
		return p.Ping(ctx).Err()
	}
	return r.rdb.Eval(ctx, "return 1", nil).Err()
}

// clockArg is the script's now in µs, or -1 to use the server's TIME.
func (r *Redis) clockArg() int64 {
	if r.now == nil {
		return -1
	}
	return r.now().UnixMicro()
}

// The scripts share a prologue that reads now (µs) from ARGV[1] or the server's TIME.
// Numbers are written with %d: tostring keeps only 14 digits.
const scriptNow = `
local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
`

// takeScript: KEYS[1] the lock, KEYS[2..n+1] the buckets; ARGV[1] now, then per bucket its
// emission interval (µs) and limit. Returns {1, lock left} when locked, else
// {0, allowed, then per bucket: allowed, remaining, reset after, retry after}. It is gcra()
// in Lua; keep them in step.
var takeScript = redis.NewScript(scriptNow + `
local lock = tonumber(redis.call('GET', KEYS[1]) or '0')
if lock > now then return {1, lock - now} end
local n = #KEYS - 1
local out = {0, 1}
local next = {}
for i = 1, n do
  local em = tonumber(ARGV[2*i])
  local burst = em * tonumber(ARGV[2*i+1])
  local tat = tonumber(redis.call('GET', KEYS[i+1]) or '0')
  if tat < now then tat = now end
  local nt = tat + em
  local diff = now - (nt - burst)
  if diff < 0 then
    out[2] = 0
    table.insert(out, 0); table.insert(out, 0); table.insert(out, tat - now); table.insert(out, -diff)
  else
    next[i] = nt
    table.insert(out, 1); table.insert(out, math.floor(diff / em)); table.insert(out, nt - now); table.insert(out, 0)
  end
end
if out[2] == 1 then
  for i = 1, n do
    redis.call('SET', KEYS[i+1], string.format('%d', next[i]), 'PX', math.ceil((next[i] - now) / 1000))
  end
end
return out
`)

// lockedScript: KEYS[1] the lock; ARGV[1] now. Returns the µs the lock still holds, or 0.
var lockedScript = redis.NewScript(scriptNow + `
local lock = tonumber(redis.call('GET', KEYS[1]) or '0')
if lock > now then return lock - now end
return 0
`)

// failScript: KEYS[1] the failure log (a list, newest first), KEYS[2] the lock; ARGV[1] now,
// ARGV[2] failures, ARGV[3] window (µs), ARGV[4] lock (µs). Returns {started, held}: {1, 0}
// when the lock starts, {0, µs} while it already holds, else {0, 0}. It is Memory.Fail in
// Lua; keep them in step.
var failScript = redis.NewScript(scriptNow + `
local held = tonumber(redis.call('GET', KEYS[2]) or '0')
if held > now then return {0, held - now} end
local n = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local lock = tonumber(ARGV[4])
redis.call('LPUSH', KEYS[1], string.format('%d', now))
redis.call('LTRIM', KEYS[1], 0, n - 1)
if redis.call('LLEN', KEYS[1]) >= n and now - tonumber(redis.call('LINDEX', KEYS[1], n - 1)) < window then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], string.format('%d', now + lock), 'PX', math.ceil(lock / 1000))
  return {1, 0}
end
redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
return {0, 0}
`)

// Take implements Backend.
func (r *Redis) Take(ctx context.Context, lockKey string, buckets []Bucket) (Outcome, error) {
	keys := make([]string, 0, 1+len(buckets))
	keys = append(keys, r.prefix+lockKey)
	args := make([]any, 0, 1+2*len(buckets))
	args = append(args, r.clockArg())
	for _, b := range buckets {
		keys = append(keys, r.prefix+b.Key)
		args = append(args, b.Window.emission(), b.Window.Limit)
	}
	res, err := takeScript.Run(ctx, r.rdb, keys, args...).Int64Slice()
	if err != nil {
		return Outcome{}, fmt.Errorf("limits: redis take: %w", err)
	}
	if len(res) >= 2 && res[0] == 1 {
		return Outcome{Locked: us(res[1]), Backend: r.Name()}, nil
	}
	if len(res) != 2+4*len(buckets) {
		return Outcome{}, fmt.Errorf("limits: redis take: %d values for %d buckets", len(res), len(buckets))
	}
	out := Outcome{Allowed: res[1] == 1, Windows: make([]WindowState, len(buckets)), Backend: r.Name()}
	for i := range buckets {
		v := res[2+4*i:]
		out.Windows[i] = WindowState{Allowed: v[0] == 1, Remaining: int(v[1]), ResetAfter: us(v[2]), RetryAfter: us(v[3])}
	}
	return out, nil
}

// LockedFor implements Backend.
func (r *Redis) LockedFor(ctx context.Context, lockKey string) (time.Duration, error) {
	n, err := lockedScript.Run(ctx, r.rdb, []string{r.prefix + lockKey}, r.clockArg()).Int64()
	if err != nil {
		return 0, fmt.Errorf("limits: redis lock: %w", err)
	}
	return us(n), nil
}

// Fail implements Backend.
func (r *Redis) Fail(ctx context.Context, logKey, lockKey string, rule Lockout) (bool, time.Duration, error) {
	res, err := failScript.Run(ctx, r.rdb, []string{r.prefix + logKey, r.prefix + lockKey},
		r.clockArg(), rule.Failures, rule.Window.Microseconds(), rule.Lock.Microseconds()).Int64Slice()
	if err != nil {
		return false, 0, fmt.Errorf("limits: redis fail: %w", err)
	}
	if len(res) != 2 {
		return false, 0, fmt.Errorf("limits: redis fail: %d values", len(res))
	}
	return res[0] == 1, us(res[1]), nil
}

// formatMicros keeps key suffixes short and exact.
func formatMicros(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) }
