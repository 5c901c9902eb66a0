package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	pgxuuid "github.com/vgarvardt/pgx-google-uuid/v5"
)

// bench is the state of one run: the binaries, the server, and everything
// started or created so far, so that it can all be cleaned up.
type bench struct {
	opts  options
	out   io.Writer
	dir   string
	bins  map[string]string
	admin *pgxpool.Pool
	rep   *report
	runID string

	dbs   []string
	procs []*proc
	seq   int

	// relayRate is the relay scenario's drain rate, the reference of the
	// recovery drain when both run.
	relayRate float64
}

const topic = "orders.events"

// The bearer tokens the services are started with.
const (
	customerToken = "bench-customer"
	notifierToken = "bench-notifier"
	authTokens    = customerToken + "=bench:customer," + notifierToken + "=notifier:service"
)

func run(ctx context.Context, opts options, out io.Writer) (err error) {
	b := &bench{opts: opts, out: out, bins: map[string]string{},
		rep:   &report{Started: time.Now().UTC(), Tiny: opts.Tiny},
		runID: fmt.Sprintf("%d_%d", os.Getpid(), time.Now().Unix()%100000)}
	if b.dir, err = os.MkdirTemp("", "outbox-bench-"); err != nil {
		return err
	}
	failed := false
	defer func() {
		b.cleanup()
		if opts.KeepLogs || failed {
			fmt.Fprintf(out, "binaries and logs kept in %s\n", b.dir)
		} else {
			os.RemoveAll(b.dir)
		}
	}()
	if err := b.build(ctx); err != nil {
		failed = true
		return err
	}
	if b.admin, err = pgxpool.New(ctx, b.dbURL("postgres")); err != nil {
		failed = true
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	b.hostInfo(ctx)
	fmt.Fprintf(out, "bench: %d CPUs, %d MiB, %s, %s; scenarios %s\n",
		b.rep.Host.CPUs, b.rep.Host.MemoryMiB, b.rep.Host.PostgreSQL, b.rep.Host.GoVersion, strings.Join(opts.Scenarios, ", "))
	scenarios := map[string]func(context.Context) error{
		"relay":    b.relayScenario,
		"api":      b.apiScenario,
		"notifier": b.notifierScenario,
		"latency":  b.latencyScenario,
		"recovery": b.recoveryScenario,
		"capacity": b.capacityScenario,
	}
	for _, name := range opts.Scenarios {
		if ctx.Err() != nil {
			break
		}
		start := time.Now()
		fmt.Fprintf(out, "== %s\n", name)
		if err := scenarios[name](ctx); err != nil {
			failed = true
			b.rep.Failures = append(b.rep.Failures, fmt.Sprintf("%s: %v", name, err))
			fmt.Fprintf(out, "%s failed: %v\n", name, err)
		}
		b.stopAll(name)
		b.dropDatabases(ctx)
		fmt.Fprintf(out, "== %s done in %s\n", name, time.Since(start).Round(100*time.Millisecond))
	}
	fmt.Fprintln(out)
	if b.rep.LoadTool != "" {
		fmt.Fprintf(out, "HTTP load generator: %s\n", b.rep.LoadTool)
	}
	if err := writeTable(out, b.rep); err != nil {
		return err
	}
	if opts.JSONFile != "" {
		if err := writeJSON(opts.JSONFile, b.rep); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		failed = true
		return ctx.Err()
	}
	if len(b.rep.Failures) > 0 {
		return fmt.Errorf("%d scenario(s) failed", len(b.rep.Failures))
	}
	return nil
}

// build compiles the binaries into the temporary directory: the two
// services, the broker and the api scenario's bare HTTP reference.
func (b *bench) build(ctx context.Context) error {
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	binDir := filepath.Join(b.dir, "bin")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", binDir+"/", "./cmd/orders", "./cmd/notifier", "./cmd/devbroker", "./cmd/bench/bareapi")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	for _, n := range []string{"orders", "notifier", "devbroker", "bareapi"} {
		b.bins[n] = filepath.Join(binDir, n)
	}
	return nil
}

func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("run the benchmark inside the module (go env GOMOD is empty)")
	}
	return filepath.Dir(mod), nil
}

func (b *bench) hostInfo(ctx context.Context) {
	h := &b.rep.Host
	h.CPUs = runtime.NumCPU()
	h.GoVersion = runtime.Version()
	if raw, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int
		fmt.Sscanf(strings.TrimPrefix(strings.SplitN(string(raw), "\n", 2)[0], "MemTotal:"), "%d", &kb)
		h.MemoryMiB = kb / 1024
	}
	// The settings that move the figures most: the commit's flush, the
	// buffer cache, and whether statistics are refreshed during a run.
	var v, fsync, sync, buffers, autovacuum string
	_ = b.admin.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit'),
		current_setting('shared_buffers'), current_setting('autovacuum')`).Scan(&v, &fsync, &sync, &buffers, &autovacuum)
	h.PostgreSQL = fmt.Sprintf("PostgreSQL %s (fsync=%s, synchronous_commit=%s, shared_buffers=%s, autovacuum=%s)", v, fsync, sync, buffers, autovacuum)
}

// dbURL is the URL of one database on the server.
func (b *bench) dbURL(name string) string {
	u := strings.TrimRight(b.opts.PG, "/") + "/" + name
	if !strings.Contains(u, "?") {
		u += "?sslmode=disable"
	}
	return u
}

// newDB creates an empty database with a unique name, or a copy of
// template when it is not empty.
func (b *bench) newDB(ctx context.Context, label, template string) (string, error) {
	b.seq++
	name := fmt.Sprintf("bench_%s_%s_%d", b.runID, label, b.seq)
	q := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		q += " TEMPLATE " + pgx.Identifier{template}.Sanitize() + " STRATEGY FILE_COPY"
	}
	if _, err := b.admin.Exec(ctx, q); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	b.dbs = append(b.dbs, name)
	return name, nil
}

// ordersDB creates and migrates a fresh orders database.
func (b *bench) ordersDB(ctx context.Context, label string) (string, error) {
	name, err := b.newDB(ctx, label, "")
	if err != nil {
		return "", err
	}
	return name, runCmd(ctx, b.bins["orders"], map[string]string{"DATABASE_URL": b.dbURL(name)}, "migrate")
}

// notifierDB creates and migrates a fresh notifier database.
func (b *bench) notifierDB(ctx context.Context, label string) (string, error) {
	name, err := b.newDB(ctx, label, "")
	if err != nil {
		return "", err
	}
	return name, runCmd(ctx, b.bins["notifier"], map[string]string{"DATABASE_URL": b.dbURL(name)}, "migrate")
}

// pool opens a pool on db whose connections encode uuid.UUID in binary, as
// the services' pools do, so that the SQL references spend no more per
// statement than the services.
func (b *bench) pool(ctx context.Context, db string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(b.dbURL(db))
	if err != nil {
		return nil, err
	}
	cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		pgxuuid.Register(conn.TypeMap())
		return nil
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

func (b *bench) dropDatabases(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	for _, name := range b.dbs {
		if _, err := b.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			fmt.Fprintf(b.out, "drop database %s: %v\n", name, err)
		}
	}
	b.dbs = nil
}

// start starts a service and remembers it for the RSS report and cleanup.
func (b *bench) start(name, bin string, env map[string]string, args ...string) (*proc, error) {
	p, err := startProc(b.dir, strings.ReplaceAll(name, " ", "-"), bin, env, args...)
	if err != nil {
		return nil, err
	}
	p.name = name
	b.procs = append(b.procs, p)
	return p, nil
}

// startBroker starts devbroker on a free port with the orders topic.
func (b *bench) startBroker(ctx context.Context) (*proc, string, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	p, err := b.start("devbroker", b.bins["devbroker"], map[string]string{
		"DEVBROKER_ADDR": addr, "ORDERS_TOPIC": topic, "ORDERS_TOPIC_PARTITIONS": "6",
	})
	if err != nil {
		return nil, "", err
	}
	return p, addr, p.waitPort(ctx, addr)
}

// stopProc stops one service and records its peak RSS against the RSS it
// had once ready.
func (b *bench) stopProc(scenario string, p *proc) error {
	peak, err := p.stop(60 * time.Second)
	if peak > 0 {
		r := result{Scenario: scenario, Figure: "peak RSS " + p.name, Value: peak, Unit: "MiB", Target: "< 100 MiB"}
		if p.idleRSS > 0 {
			r.Reference, r.RefValue = "RSS when ready", p.idleRSS
		}
		if p.name == "devbroker" {
			r.Target = "- (holds the topic in memory)"
		}
		b.rep.add(r)
	}
	return err
}

// stopAll stops what a scenario left running, newest first.
func (b *bench) stopAll(scenario string) {
	for i := len(b.procs) - 1; i >= 0; i-- {
		if p := b.procs[i]; !p.stopped {
			if err := b.stopProc(scenario, p); err != nil {
				fmt.Fprintf(b.out, "stop %s: %v\n", p.name, err)
			}
		}
	}
	b.procs = nil
}

func (b *bench) cleanup() {
	for i := len(b.procs) - 1; i >= 0; i-- {
		if p := b.procs[i]; !p.stopped {
			_, _ = p.stop(30 * time.Second)
		}
	}
	b.procs = nil
	if b.admin != nil {
		b.dropDatabases(context.Background())
		b.admin.Close()
	}
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.out, "  "+format+"\n", args...)
}

// waitFor polls cond every interval until it reports true, the timeout
// passes, one of the processes exits, or ctx ends.
func waitFor(ctx context.Context, timeout, interval time.Duration, procs []*proc, cond func(context.Context) (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond(ctx)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		for _, p := range procs {
			if err := p.check(); err != nil {
				return err
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %s", errTimeout, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}
