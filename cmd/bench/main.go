// Command bench measures the whole chain end to end with real processes:
// the orders API and its relay, the notifier, a dev Kafka broker and
// PostgreSQL. Every figure is printed next to a reference measured in the
// same run on the same machine, so that runs on a shared or slower host
// are compared by their ratios rather than by absolute numbers.
//
//	go run ./cmd/bench [flags] relay|api|notifier|latency|recovery|capacity|all ...
//
// It builds the binaries into a temporary directory, creates fresh
// databases with unique names (dropped at the end), starts devbroker on a
// free port and prints one table of figures. See docs/benchmarks.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts, err := parseArgs(os.Args[1:], os.Stderr)
	if errors.Is(err, errHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if err := run(ctx, opts, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
