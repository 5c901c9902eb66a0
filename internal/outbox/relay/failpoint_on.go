//go:build failpoints

package relay

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// In builds with the "failpoints" tag, the crash points named in the
// FAILPOINTS environment variable kill the process with SIGKILL:
//
//	FAILPOINTS=relay/after-claim=kill,relay/after-confirm=kill@3
//
// "kill" acts the first time the point is reached, "kill@N" the N-th
// time. No deferred code runs and no lease is released: exactly a machine
// dying in that window. "stop" sends SIGSTOP instead: the relay freezes
// there until a SIGCONT, like a process paused past its lease. The package carries this small mechanism itself so
// that it stays self-contained; a service has its own for its own points.
var failpoints = parseFailpoints(os.Getenv("FAILPOINTS"))

type armedFailpoint struct {
	stop bool // SIGSTOP instead of SIGKILL: a relay that stalls and resumes later
	at   int64
	hits atomic.Int64
}

func parseFailpoints(spec string) map[string]*armedFailpoint {
	out := map[string]*armedFailpoint{}
	for _, item := range strings.Split(spec, ",") {
		name, action, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || !strings.HasPrefix(name, "relay/") {
			continue // empty, or another component's point
		}
		at := int64(1)
		if a, n, found := strings.Cut(action, "@"); found {
			v, err := strconv.ParseInt(n, 10, 64)
			if err != nil || v < 1 {
				a = ""
			}
			action, at = a, v
		}
		if action != "kill" && action != "stop" {
			fmt.Fprintf(os.Stderr, "failpoint: ignoring %q: want name=kill|stop, or with @N\n", item)
			continue
		}
		out[name] = &armedFailpoint{at: at, stop: action == "stop"}
		fmt.Fprintf(os.Stderr, "failpoint: %s armed: %s at hit %d\n", name, action, at)
	}
	return out
}

func failpoint(name string) {
	p := failpoints[name]
	if p == nil || p.hits.Add(1) != p.at {
		return
	}
	if p.stop {
		// The process freezes here until someone sends SIGCONT: a relay
		// that stalled past its lease and then carries on.
		fmt.Fprintf(os.Stderr, "failpoint: %s reached: SIGSTOP\n", name)
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint: %s reached: SIGKILL\n", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // never return into the window
}
