// Package gcdefaults gives the Go collector the settings of a service that
// shares its host with its database: collect less often than the runtime's
// default, and bound the memory that buys.
//
// The runtime's default (GOGC=100) starts a cycle each time the heap has
// doubled since the last one. A service whose live heap is a few MiB, such
// as the outbox relay, then collects dozens of times a second under a
// backlog, and each cycle's mark workers also take the cores that are idle
// at that moment, which on a shared host are the database's. With GOGC=400
// a cycle starts when the heap has grown by four times its live size; the
// soft memory limit makes the collector run sooner when a larger live heap
// would otherwise take the process past it.
package gcdefaults

import "runtime/debug"

const (
	// GCPercent is the collector's target percentage unless GOGC is set.
	GCPercent = 400
	// MemoryLimit is the runtime's soft memory limit unless GOMEMLIMIT is
	// set: under the 100 MiB each service is allowed, with room for what
	// the runtime does not count (the binary's own pages).
	MemoryLimit = 48 << 20
)

// Apply sets GCPercent unless getenv("GOGC") is set, and MemoryLimit
// unless getenv("GOMEMLIMIT") is set; the runtime has read both variables
// already, and the operator's values win.
func Apply(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(GCPercent)
	}
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(MemoryLimit)
	}
}
