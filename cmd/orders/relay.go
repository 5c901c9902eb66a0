package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/kafkaconf"
	"github.com/outboxref/orders/internal/migrate"
	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/relay"
)

// startRelay builds this process's outbox relay, not yet running, and
// starts creating the topic in the background. The caller runs it with
// relay.Run(ctx); Run owns the Kafka producer and flushes and closes it
// when ctx ends. ctx also bounds the topic creation, which retries until
// it succeeds: a missing broker never blocks start-up or readiness (O3),
// since absorbing a broker outage is the outbox's job.
func startRelay(ctx context.Context, cfg Config, pool *pgxpool.Pool, log *slog.Logger, reg prometheus.Registerer, types []outbox.EventType) (*relay.Relay, error) {
	conn, err := cfg.Kafka.Conn.Options()
	if err != nil {
		return nil, err
	}
	conn = append(conn, kgo.WithLogger(kafkaconf.Logger(log, kgo.LogLevelWarn)))
	r, err := relay.NewRelay(relay.Config{
		Pool:            pool,
		Kafka:           conn,
		Topic:           cfg.Kafka.Topic,
		Source:          cfg.Relay.Source,
		Types:           types,
		BatchSize:       cfg.Relay.BatchSize,
		Lease:           cfg.Relay.Lease,
		ProduceTimeout:  cfg.Kafka.ProduceTimeout,
		PollInterval:    cfg.Relay.PollInterval,
		BackoffBase:     cfg.Relay.BackoffBase,
		BackoffCap:      cfg.Relay.BackoffCap,
		DrainTimeout:    cfg.Relay.DrainTimeout,
		MaxMessageBytes: cfg.Kafka.MaxMessageBytes,
		Logger:          log,
		Registerer:      reg,
	})
	if err != nil {
		return nil, err
	}
	go func() {
		// It retries until the topic exists; ctx ending means the process
		// is stopping, which needs no log line of its own.
		if err := relay.EnsureTopic(ctx, conn, cfg.Kafka.Topic, cfg.Kafka.TopicPartitions, log); err != nil && ctx.Err() == nil {
			log.ErrorContext(ctx, "kafka topic not ensured", "error", err)
		}
	}()
	return r, nil
}

// runRelayOnly is `orders relay`: the relay without the API, so that
// relays can be scaled apart from it. Any number may run against one
// database. It serves /metrics, /healthz and /readyz on RELAY_METRICS_ADDR
// and stops gracefully when ctx ends (R9).
func runRelayOnly(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := loadRelayConfig(getenv)
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

	// The relay gets its own context: it must outlive ctx long enough to
	// drain, confirm and release, and it is stopped explicitly below.
	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRelay()
	rel, err := startRelay(relayCtx, cfg, pool, log, reg, orderEventTypes())
	if err != nil {
		return err
	}
	schemaCheck := migrate.NewSchemaCheck(pool, schema.Orders())

	// This process also continues the replays a stopped process left
	// (interrupted, or running on a dead runner's lease): a replay
	// resumes wherever a relay starts.
	replays, err := newReplayer(cfg, pool, log)
	if err != nil {
		return err
	}
	defer replays.close()
	replaysCtx, stopReplays := context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		stopReplays()
		wctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		replays.stopReplays(wctx)
	}()
	go func() {
		if schemaCheck.Wait(replaysCtx, 2*time.Second, func(error) {}) == nil {
			replays.resumeReplays(replaysCtx)
		}
	}()

	relayDone := make(chan error, 1)
	go func() {
		if err := waitForSchema(relayCtx, schemaCheck, log); err != nil {
			relayDone <- nil
			return
		}
		relayDone <- rel.Run(relayCtx)
	}()

	srv := &http.Server{
		Addr:              cfg.Relay.MetricsAddr,
		Handler:           relayMux(reg, pool, schemaCheck),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	serverErr := make(chan error, 1)
	go func() { serverErr <- srv.ListenAndServe() }()
	log.InfoContext(ctx, "orders relay started", "metrics_addr", cfg.Relay.MetricsAddr, "lease_owner", rel.Owner())

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutdown requested")
	case err := <-serverErr:
		runErr = fmt.Errorf("metrics server: %w", err)
	case err := <-relayDone:
		relayDone <- err
		log.Error("relay stopped unexpectedly", "error", fmt.Sprint(err))
	}

	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	stopReplays()
	stopRelay()
	select {
	case err := <-relayDone:
		if err != nil && runErr == nil {
			runErr = fmt.Errorf("relay: %w", err)
		}
	case <-shutdownCtx.Done():
		runErr = errors.Join(runErr, errors.New("relay did not stop within SHUTDOWN_TIMEOUT"))
	}
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("metrics server shutdown incomplete", "error", err.Error())
	}
	if runErr == nil {
		log.Info("orders relay stopped")
	}
	return runErr
}

// relayMux serves the relay-only process's operations endpoints. Readiness
// reflects the database only: a broker outage is what the outbox absorbs,
// and it shows in the metrics (O3).
func relayMux(reg *prometheus.Registry, pool *pgxpool.Pool, schemaCheck *migrate.SchemaCheck) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "ok\n") //nolint:errcheck // best effort
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := pool.Ping(ctx); err != nil {
			http.Error(w, "database unavailable", http.StatusServiceUnavailable)
			return
		}
		if err := schemaCheck.Check(ctx); err != nil {
			http.Error(w, "schema: "+err.Error()+"; run `orders migrate`", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n") //nolint:errcheck // best effort
	})
	return mux
}
