//go:build failpoints

package failpoint

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// armedPoint is one failpoint named in FAILPOINTS.
type armedPoint struct {
	action string // kill or stop
	at     int64  // the hit that triggers, from 1
	hits   atomic.Int64
}

var armed = parse(os.Getenv("FAILPOINTS"))

func parse(spec string) map[string]*armedPoint {
	out := map[string]*armedPoint{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, action, ok := strings.Cut(item, "=")
		at := int64(1)
		if a, n, found := strings.Cut(action, "@"); found {
			v, err := strconv.ParseInt(n, 10, 64)
			if err != nil || v < 1 {
				ok = false
			}
			action, at = a, v
		}
		if !ok || (action != "kill" && action != "stop") {
			fmt.Fprintf(os.Stderr, "failpoint: ignoring %q: want name=kill|stop, or with @N\n", item)
			continue
		}
		out[name] = &armedPoint{action: action, at: at}
		fmt.Fprintf(os.Stderr, "failpoint: %s armed: %s at hit %d\n", name, action, at)
	}
	return out
}

// Inject kills the process if the failpoint name is armed and this is the
// hit it waits for.
func Inject(name string) {
	p := armed[name]
	if p == nil || p.hits.Add(1) != p.at {
		return
	}
	if p.action == "stop" {
		fmt.Fprintf(os.Stderr, "failpoint: %s reached: SIGSTOP\n", name)
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint: %s reached: SIGKILL\n", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way; never return into the window
}
