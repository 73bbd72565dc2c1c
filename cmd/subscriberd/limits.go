package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/redis/go-redis/v9"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/limits"
)

// limitSettings is the limits configuration, parsed and validated before anything starts.
type limitSettings struct {
	cfg       limits.Config
	trusted   []netip.Prefix
	redis     *redis.Options // nil: counters in the process
	redisDesc string         // REDIS_URL without its password, for the log
}

// limitsFrom takes the limits settings from cfg (parsed and validated when it was loaded).
func limitsFrom(cfg *Config) (limitSettings, error) {
	s := limitSettings{
		cfg: limits.Config{
			Rate:         cfg.RateLimits,
			Bulk:         cfg.BulkRateLimits,
			AuthLockout:  cfg.AuthLockout,
			WriteLockout: cfg.WriteLockout,
			Confirm:      cfg.ConfirmRateLimits,
		},
		trusted: cfg.TrustedProxies,
	}
	if cfg.RedisURL != "" {
		var err error
		if s.redis, err = limits.RedisOptions(cfg.RedisURL); err != nil {
			return s, err
		}
		s.redisDesc = redact(cfg.RedisURL)
	}
	return s, nil
}

// newLimiter builds the limiter: in the process, or on Redis with the process as fallback
// while Redis is unreachable (a limiter outage never becomes an API outage). The returned
// function releases it.
func newLimiter(ctx context.Context, s limitSettings, log *slog.Logger, rec limits.Recorder) (api.Limiter, func()) {
	if s.redis == nil {
		log.Info("rate limits: counters in this process; set REDIS_URL to share them between instances")
		return limits.New(s.cfg, limits.NewMemory(nil, 0), limits.WithRecorder(rec), limits.WithLogger(log)), func() {}
	}
	// go-redis logs every failed dial itself; the limiter already logs each change of state
	// once, so its messages go to debug. (A process-wide setting: this is the one client.)
	redis.SetLogger(redisLogger{log})
	rdb := redis.NewClient(s.redis)
	f := limits.NewFailover(ctx, limits.NewRedis(rdb, "", nil), limits.NewMemory(nil, 0), log, rec, 0)
	log.Info("rate limits: counters shared through Redis", "redis", s.redisDesc, "redis_up", f.Up())
	return limits.New(s.cfg, f, limits.WithRecorder(rec), limits.WithLogger(log)), func() {
		f.Close()
		rdb.Close() //nolint:errcheck // closing at exit
	}
}

// redisLogger sends go-redis's own messages to the debug level.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}
