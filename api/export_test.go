package api

import "time"

// SetKeyCacheClock replaces the key cache's clock, so tests move time instead of sleeping.
// It must be called before the server handles requests.
func SetKeyCacheClock(s *Server, now func() time.Time) { s.keys.now = now }

// LaravelKey and HumaError expose the error builders that only Huma's own failures reach.
var (
	LaravelKey = laravelKey
	HumaError  = humaError
)
