package gcdefaults_test

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/outboxref/orders/internal/gcdefaults"
)

// settings returns the collector's target percentage and soft memory limit
// without changing them.
func settings() (percent int, limit int64) {
	percent = debug.SetGCPercent(-1)
	debug.SetGCPercent(percent)
	return percent, debug.SetMemoryLimit(-1) // a negative limit only reads it
}

// restore puts the collector back as the test found it.
func restore(t *testing.T) {
	percent, limit := settings()
	t.Cleanup(func() {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	})
}

func TestApplySetsTheDefaultsWhenTheEnvironmentIsSilent(t *testing.T) {
	restore(t)
	debug.SetGCPercent(100)
	debug.SetMemoryLimit(math.MaxInt64)

	gcdefaults.Apply(func(string) string { return "" })

	percent, limit := settings()
	if percent != gcdefaults.GCPercent || limit != gcdefaults.MemoryLimit {
		t.Fatalf("got GOGC %d and a limit of %d bytes, want %d and %d", percent, limit, gcdefaults.GCPercent, gcdefaults.MemoryLimit)
	}
}

func TestApplyLeavesWhatTheOperatorSet(t *testing.T) {
	restore(t)
	// What the runtime would have read from GOGC=150 and GOMEMLIMIT=1GiB.
	debug.SetGCPercent(150)
	debug.SetMemoryLimit(1 << 30)
	env := map[string]string{"GOGC": "150", "GOMEMLIMIT": "1GiB"}

	gcdefaults.Apply(func(k string) string { return env[k] })

	if percent, limit := settings(); percent != 150 || limit != 1<<30 {
		t.Fatalf("got GOGC %d and a limit of %d bytes, want the operator's 150 and %d", percent, limit, 1<<30)
	}
}

func TestApplyLeavesAnOperatorsOff(t *testing.T) {
	restore(t)
	// GOGC=off: the runtime reads it as -1.
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(math.MaxInt64)
	env := map[string]string{"GOGC": "off"}

	gcdefaults.Apply(func(k string) string { return env[k] })

	if percent, limit := settings(); percent != -1 || limit != gcdefaults.MemoryLimit {
		t.Fatalf("got GOGC %d and a limit of %d bytes, want off (-1) and %d", percent, limit, gcdefaults.MemoryLimit)
	}
}
