package main

import (
	"math"
	"runtime/debug"
	"testing"
)

// TestTuneGC: serve's collector defaults apply only where GOGC and GOMEMLIMIT are unset.
func TestTuneGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	if gogc, limit := tuneGC(func(string) string { return "" }); gogc != defaultGOGC || limit != defaultGOMEMLIMIT {
		t.Errorf("nothing set: GOGC %d, limit %d; want %d, %d", gogc, limit, defaultGOGC, defaultGOMEMLIMIT)
	}
	// What the runtime read from the operator's variables stays.
	debug.SetGCPercent(77)
	debug.SetMemoryLimit(1 << 30)
	env := map[string]string{"GOGC": "77", "GOMEMLIMIT": "1GiB"}
	if gogc, limit := tuneGC(func(k string) string { return env[k] }); gogc != 77 || limit != 1<<30 {
		t.Errorf("both set: GOGC %d, limit %d; want the operator's 77 and 1 GiB", gogc, limit)
	}
}
