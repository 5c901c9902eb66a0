package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	pgxuuid "github.com/vgarvardt/pgx-google-uuid/v5"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/debugserver"
	"github.com/outboxref/orders/internal/migrate"
	"github.com/outboxref/orders/internal/orders"
	"github.com/outboxref/orders/internal/ordersapi"
	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/relay"
	"github.com/outboxref/orders/internal/telemetry"
)

// orderEventTypes is the outbox's view of the order events.
func orderEventTypes() []outbox.EventType {
	types, err := orders.EventTypes()
	if err != nil {
		// The schemas are embedded at build time; a missing one is a
		// build defect, not a runtime condition.
		panic(err)
	}
	return types
}

// newLogger returns the service's JSON logger; lines logged inside a span
// carry trace_id and span_id (L4).
func newLogger(stdout io.Writer, level slog.Level) *slog.Logger {
	return slog.New(telemetry.LogHandler(slog.NewJSONHandler(stdout, &slog.HandlerOptions{Level: level})))
}

// startDiagnostics sets up what every long-running command has: the
// logger at level, tracing from the OTEL_* variables, and the pprof
// listener on debugAddr when set. The returned stop closes the listener and
// flushes the traces, last, once the command has ended its spans.
func startDiagnostics(ctx context.Context, getenv func(string) string, stdout io.Writer, level slog.Level,
	debugAddr string, shutdownTimeout time.Duration,
) (*slog.Logger, func(), error) {
	log := newLogger(stdout, level)
	flushTraces, err := setupTracing(ctx, getenv, log, shutdownTimeout)
	if err != nil {
		return nil, nil, err
	}
	debug, err := debugserver.Start(debugAddr, log)
	if err != nil {
		flushTraces()
		return nil, nil, err
	}
	return log, func() {
		debug.Close()
		flushTraces()
	}, nil
}

// setupTracing installs tracing from the OTEL_* variables (off unless
// OTEL_TRACES_EXPORTER is set) and returns the function that flushes it,
// bounded by SHUTDOWN_TIMEOUT, for the caller to defer: it runs last, once
// the API and the relay have ended their spans.
func setupTracing(ctx context.Context, getenv func(string) string, log *slog.Logger, timeout time.Duration) (func(), error) {
	tracing, err := telemetry.Setup(ctx, getenv, "orders", log)
	if err != nil {
		return nil, err
	}
	return func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		if err := tracing.Shutdown(fctx); err != nil {
			log.Warn("tracing shutdown incomplete", "error", err.Error())
		}
	}, nil
}

// defaultPoolSize is the most connections orders opens when DATABASE_URL
// does not set pool_max_conns. pgxpool's own default (the number of CPUs,
// at least 4) is too small for a write API: a command spends most of its
// time waiting for its commit to reach the disk, and only commits in
// flight together share one WAL flush. 16 connections let that group
// commit work while three instances stay under PostgreSQL's default
// max_connections (100).
const defaultPoolSize = 16

func openPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = defaultPoolSize
	}
	// pgx encodes a google/uuid value through its driver.Valuer, as text
	// that the uuid codec then parses back, and scans one the same way
	// round; every create sends and reads several. The codec registered
	// here takes its 16 bytes directly: a fifth fewer allocations and about
	// a tenth less CPU per create (BenchmarkCommands, docs/benchmarks.md).
	cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		pgxuuid.Register(conn.TypeMap())
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %w", err)
	}
	return pool, nil
}

// waitForSchema blocks until the database holds every migration this
// binary embeds, logging what is missing now and then.
func waitForSchema(ctx context.Context, schemaCheck *migrate.SchemaCheck, log *slog.Logger) error {
	last := time.Time{}
	return schemaCheck.Wait(ctx, 2*time.Second, func(err error) {
		if time.Since(last) > 30*time.Second {
			last = time.Now()
			log.WarnContext(ctx, "waiting for the database schema; run `orders migrate`", "reason", err.Error())
		}
	})
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// runServe runs the API and, unless disabled, the relay, until ctx ends.
// Shutdown order: stop accepting HTTP requests and let in-flight ones
// finish (their transactions commit or roll back), then stop the relay so
// it releases its leases and flushes the producer (R9).
func runServe(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	cfg.print(stdout)
	log, stopDiagnostics, err := startDiagnostics(ctx, getenv, stdout, cfg.LogLevel, cfg.DebugAddr, cfg.ShutdownTimeout)
	if err != nil {
		return err
	}
	defer stopDiagnostics()

	pool, err := openPool(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	reg := newRegistry()

	schemaCheck := migrate.NewSchemaCheck(pool, schema.Orders())
	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRelay()
	// relayDone stays nil (never ready) when the relay is disabled.
	var relayDone chan error
	nudge := func() {}
	brokerState := func() string { return "not used here (RELAY_ENABLED=false)" }
	if cfg.Relay.Enabled {
		relayDone = make(chan error, 1)
		rel, err := startRelay(relayCtx, cfg, pool, log, reg, orderEventTypes())
		if err != nil {
			return err
		}
		nudge, brokerState = rel.Nudge, rel.BrokerState
		go func() {
			// Claims on missing tables would only fail; wait for `orders
			// migrate` (readiness says what is missing meanwhile).
			if err := waitForSchema(relayCtx, schemaCheck, log); err != nil {
				relayDone <- nil
				return
			}
			relayDone <- rel.Run(relayCtx)
		}()
	} else {
		// The backlog metrics come from the table, so this process still
		// shows a growing age when the relays elsewhere stop (O1).
		if err := reg.Register(relay.NewStatsCollector(pool, orderEventTypes(), log)); err != nil {
			return fmt.Errorf("register outbox metrics: %w", err)
		}
		log.Info("relay disabled (RELAY_ENABLED=false); run `orders relay` elsewhere to deliver events")
	}

	// Operations: the admin API (replays outlive their requests, so they
	// follow opsCtx), the resumption of replays a stopped process left,
	// and the retention cleanup (O4-O6).
	opsCtx, stopOps := context.WithCancel(context.WithoutCancel(ctx))
	defer stopOps()
	ops, err := newOperations(opsCtx, cfg, pool, log, reg)
	if err != nil {
		return err
	}
	defer ops.close()
	// Runs first on return: replays record where they stopped while the
	// producer and the pool are still open.
	defer func() {
		stopOps()
		wctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		ops.stopReplays(wctx)
	}()
	go ops.runCleanup(opsCtx)
	go func() {
		if schemaCheck.Wait(opsCtx, 2*time.Second, func(error) {}) == nil {
			ops.resumeReplays(opsCtx)
		}
	}()
	// The commands write with the operations' Writer: one Writer per
	// process, whose direct publisher is the legacy path of O7.
	svc, err := orders.NewService(pool, orders.WithLogger(log), orders.WithNudge(nudge), orders.WithWriter(ops.writer))
	if err != nil {
		return err
	}
	api := ordersapi.New(ordersapi.Config{
		Service: svc,
		Tokens:  cfg.Tokens,
		Log:     log,
		Ready: func(ctx context.Context) error {
			if err := pool.Ping(ctx); err != nil {
				return err
			}
			return schemaCheck.Check(ctx)
		},
		// The broker's state is shown, never used for readiness (O3).
		Info:    func() map[string]string { return map[string]string{"broker": brokerState()} },
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		Admin:   ops.handler,
	})
	srv := &http.Server{
		Addr: cfg.HTTPAddr,
		// The operator console (/console) shares the operations with the
		// admin API: the same Admin, replay policy and producer.
		Handler:           withConsole(api, newConsole(opsCtx, cfg, cfg.Tokens, ops, log)),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	serverErr := make(chan error, 1)
	go func() { serverErr <- srv.ListenAndServe() }()
	log.Info("orders service started", "http_addr", cfg.HTTPAddr, "relay_enabled", cfg.Relay.Enabled, "pid", os.Getpid())

	select {
	case <-ctx.Done():
		log.Info("shutdown requested")
	case err := <-serverErr:
		stopRelay()
		if relayDone != nil {
			<-relayDone
		}
		return fmt.Errorf("http server: %w", err)
	case err := <-relayDone:
		relayDone <- err
		log.Error("relay stopped unexpectedly; shutting down", "error", fmt.Sprint(err))
	}

	// Replays stop between two events and record their progress while the
	// HTTP server drains; they are waited for on return.
	stopOps()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("http shutdown incomplete", "error", err.Error())
	}
	stopRelay()
	if relayDone != nil {
		// The relay gets its own budget: a slow HTTP drain must not leave
		// it without time to release its leases (R9).
		relayCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		select {
		case err := <-relayDone:
			if err != nil && !errors.Is(err, context.Canceled) {
				return fmt.Errorf("relay: %w", err)
			}
		case <-relayCtx.Done():
			return errors.New("relay did not stop within SHUTDOWN_TIMEOUT")
		}
	}
	log.Info("orders service stopped")
	return nil
}
