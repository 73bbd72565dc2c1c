package main

import (
	"errors"
	"math"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// TestTuneGC: serve's GOGC default applies where GOGC is unset, and the soft memory limit
// follows the container's limit at memLimitRatio where GOMEMLIMIT is unset; without a
// container limit, or when the cgroup cannot be read, it is defaultMemLimit; what the
// operator set stays.
func TestTuneGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	unset := func(string) string { return "" }
	const container = 512 << 20
	ratio := memLimitRatio
	want := int64(float64(container) * ratio)
	if gogc, limit := tuneGC(unset, memlimit.Limit(container)); gogc != defaultGOGC || limit != want {
		t.Errorf("nothing set, 512 MiB container: GOGC %d, limit %d; want %d, %d", gogc, limit, defaultGOGC, want)
	}
	for _, err := range []error{memlimit.ErrNoLimit, memlimit.ErrNoCgroup, errors.New("unreadable")} {
		debug.SetMemoryLimit(math.MaxInt64)
		noLimit := func() (uint64, error) { return 0, err }
		if _, limit := tuneGC(unset, noLimit); limit != defaultMemLimit {
			t.Errorf("container limit %v: soft limit %d, want %d", err, limit, defaultMemLimit)
		}
	}
	// What the runtime read from the operator's variables stays.
	debug.SetGCPercent(77)
	debug.SetMemoryLimit(1 << 30)
	env := map[string]string{"GOGC": "77", "GOMEMLIMIT": "1GiB"}
	if gogc, limit := tuneGC(func(k string) string { return env[k] }, memlimit.Limit(container)); gogc != 77 || limit != 1<<30 {
		t.Errorf("both set: GOGC %d, limit %d; want the operator's 77 and 1 GiB", gogc, limit)
	}
}
