package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"
)

// scenarioNames lists the scenarios in the order `all` runs them.
var scenarioNames = []string{"relay", "api", "notifier", "latency", "recovery", "capacity"}

// options is the parsed command line.
type options struct {
	Scenarios []string

	PG         string // server URL without a database name
	JSONFile   string
	Tiny       bool
	KeepLogs   bool
	RelayBatch int  // RELAY_BATCH_SIZE for the relay and its SQL references; 0: the service's default
	Senders    int  // EMAIL_SENDERS for every notifier serve; 0: the service's default
	Watermill  bool // relay: also drain with Watermill's Forwarder

	Backlog         int
	APIDuration     time.Duration
	Conns           int
	NotifierBacklog int
	Rate            int
	LatencyDuration time.Duration
	RecoveryBacklog int
	DrainTimeout    time.Duration
	CapacityStep    time.Duration
	CapacitySteps   int
}

var errHelp = errors.New("help requested")

// defaultRelayBatch is the relay's RELAY_BATCH_SIZE default, used by the SQL
// references when -relay-batch is not given.
const defaultRelayBatch = 100

// parseArgs reads the flags and scenario names. -tiny shrinks every size
// that was not set explicitly.
func parseArgs(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./cmd/bench [flags] SCENARIO...\n\nscenarios: %v, all\n\nflags:\n", scenarioNames)
		fs.PrintDefaults()
	}
	pg := os.Getenv("BENCH_PG")
	if pg == "" {
		pg = "postgres://postgres@127.0.0.1:5432"
	}
	fs.StringVar(&o.PG, "pg", pg, "PostgreSQL server URL without a database (BENCH_PG)")
	fs.StringVar(&o.JSONFile, "json", "", "also write the results to this file as JSON")
	fs.BoolVar(&o.Tiny, "tiny", false, "shrink every size and duration not set explicitly, to run in about a minute (CI)")
	fs.BoolVar(&o.KeepLogs, "keep-logs", false, "keep the temporary directory with the binaries and the processes' logs")
	fs.IntVar(&o.RelayBatch, "relay-batch", 0, "RELAY_BATCH_SIZE for the relay and the SQL references (0: the service's default)")
	fs.IntVar(&o.Senders, "email-senders", 0, "EMAIL_SENDERS for notifier serve in every scenario (0: the service's default)")
	fs.BoolVar(&o.Watermill, "watermill", true, "relay: also drain the backlog with Watermill's SQL Forwarder, the reference of the relay's ≥ 8× target (false: skip it, for quick comparisons of the relay alone)")
	fs.IntVar(&o.Backlog, "backlog", 200000, "relay: committed events in the backlog")
	fs.DurationVar(&o.APIDuration, "api-duration", 30*time.Second, "api: duration of each load run")
	fs.IntVar(&o.Conns, "conns", 32, "api: concurrent connections")
	fs.IntVar(&o.NotifierBacklog, "notifier-backlog", 200000, "notifier: records on the topic before it starts")
	fs.IntVar(&o.Rate, "rate", 1000, "latency: POST /orders per second (open loop)")
	fs.DurationVar(&o.LatencyDuration, "latency-duration", 60*time.Second, "latency: duration of the load")
	fs.IntVar(&o.RecoveryBacklog, "recovery-backlog", 1000000, "recovery: committed events in the backlog")
	fs.DurationVar(&o.CapacityStep, "capacity-step", 60*time.Second, "capacity: duration of each rate step, and of the latency runs at 50% and 80% of the capacity found")
	fs.IntVar(&o.CapacitySteps, "capacity-steps", 10, "capacity: at most this many rate steps")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", 30*time.Minute, "give up on any one drain after this long")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, errHelp
		}
		return o, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.Tiny {
		shrink := func(name string, apply func()) {
			if !set[name] {
				apply()
			}
		}
		shrink("backlog", func() { o.Backlog = 4000 })
		shrink("api-duration", func() { o.APIDuration = 3 * time.Second })
		shrink("conns", func() { o.Conns = 8 })
		shrink("notifier-backlog", func() { o.NotifierBacklog = 2000 })
		shrink("rate", func() { o.Rate = 200 })
		shrink("latency-duration", func() { o.LatencyDuration = 5 * time.Second })
		shrink("recovery-backlog", func() { o.RecoveryBacklog = 10000 })
		shrink("capacity-step", func() { o.CapacityStep = 3 * time.Second })
		shrink("capacity-steps", func() { o.CapacitySteps = 2 })
		shrink("drain-timeout", func() { o.DrainTimeout = 2 * time.Minute })
	}
	if o.RelayBatch < 0 || o.RelayBatch > 10000 {
		return o, fmt.Errorf("-relay-batch %d: want 0 to 10000", o.RelayBatch)
	}
	for name, v := range map[string]int{"backlog": o.Backlog, "conns": o.Conns, "notifier-backlog": o.NotifierBacklog, "rate": o.Rate, "recovery-backlog": o.RecoveryBacklog, "capacity-steps": o.CapacitySteps} {
		if v < 2 {
			return o, fmt.Errorf("-%s %d: want at least 2", name, v)
		}
	}
	for name, v := range map[string]time.Duration{"api-duration": o.APIDuration, "latency-duration": o.LatencyDuration, "drain-timeout": o.DrainTimeout, "capacity-step": o.CapacityStep} {
		if v <= 0 {
			return o, fmt.Errorf("-%s %s: want a positive duration", name, v)
		}
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return o, errors.New("name at least one scenario")
	}
	for _, a := range fs.Args() {
		switch {
		case a == "all":
			for _, s := range scenarioNames {
				if !slices.Contains(o.Scenarios, s) {
					o.Scenarios = append(o.Scenarios, s)
				}
			}
		case slices.Contains(scenarioNames, a):
			if !slices.Contains(o.Scenarios, a) {
				o.Scenarios = append(o.Scenarios, a)
			}
		default:
			return o, fmt.Errorf("unknown scenario %q (want one of %v or all)", a, scenarioNames)
		}
	}
	return o, nil
}

// relayBatches are the batch sizes the relay scenario drains at: the flag's
// alone, or the service's default and 500, the two sizes the relay's target
// names.
func (o options) relayBatches() []int {
	if o.RelayBatch > 0 {
		return []int{o.RelayBatch}
	}
	return []int{defaultRelayBatch, 500}
}

// batchSize is the batch the relay uses: the flag, or the service's default.
func (o options) batchSize() int {
	if o.RelayBatch > 0 {
		return o.RelayBatch
	}
	return defaultRelayBatch
}
