package main

import (
	"context"
	"encoding/json"
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
	"github.com/twmb/franz-go/pkg/kgo"
	pgxuuid "github.com/vgarvardt/pgx-google-uuid/v5"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/debugserver"
	"github.com/outboxref/orders/internal/kafkaconf"
	"github.com/outboxref/orders/internal/migrate"
	"github.com/outboxref/orders/internal/notify"
	"github.com/outboxref/orders/internal/telemetry"
)

// runServe runs the notifier until ctx ends. Shutdown order: stop the HTTP
// server, then the consumer (it finishes the batch in hand and commits the
// offsets of everything processed), then the email sender (it finishes the
// email in flight and releases what it claimed but did not start), and last
// the SMTP connection kept between sends.
func runServe(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	cfg.print(stdout)
	// Lines logged inside a span carry trace_id and span_id (L4).
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(stdout, &slog.HandlerOptions{Level: cfg.LogLevel})))
	// Tracing is off unless OTEL_TRACES_EXPORTER is set. Deferred first,
	// the flush runs last, once every worker has ended its spans.
	tracing, err := telemetry.Setup(ctx, getenv, "notifier", log)
	if err != nil {
		return err
	}
	defer func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
		defer cancel()
		if err := tracing.Shutdown(fctx); err != nil {
			log.Warn("tracing shutdown incomplete", "error", err.Error())
		}
	}()
	debug, err := debugserver.Start(cfg.DebugAddr, log)
	if err != nil {
		return err
	}
	defer debug.Close()

	mailer, err := cfg.Email.mailer()
	if err != nil {
		return err
	}
	// Deferred, so it runs once the sender has stopped. Should the stop
	// outlast SHUTDOWN_TIMEOUT, a send still in flight closes its own
	// connection instead of caching it.
	defer func() { _ = mailer.Close() }()

	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	if !strings.Contains(cfg.DatabaseURL, "pool_max_conns") {
		// Each sender holds a connection while it claims or records, the
		// consumer one per batch, and the resync, maintenance and readiness
		// work their own: the pool's default (four, or one per CPU) would
		// make the consumer queue behind the senders.
		pcfg.MaxConns = max(pcfg.MaxConns, int32(cfg.Email.Senders)+4)
	}
	// UUIDs as their 16 bytes rather than through text, as orders serve
	// does (openPool there): each record carries several.
	pcfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		pgxuuid.Register(conn.TypeMap())
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("open database pool: %w", err)
	}
	defer pool.Close()

	schemaCheck := migrate.NewSchemaCheck(pool, schema.Notifier())
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	kopts, err := cfg.Kafka.Conn.Options()
	if err != nil {
		return err
	}
	kopts = append(kopts, kgo.WithLogger(kafkaconf.Logger(log, kgo.LogLevelWarn)))
	host, _ := os.Hostname()
	svc, err := notify.NewService(pool, notify.Config{
		Consumer: notify.ConsumerConfig{
			Brokers: cfg.Kafka.Conn.Brokers, Topic: cfg.Kafka.Topic, Group: cfg.Kafka.Group,
			InstanceID: cfg.Kafka.InstanceID, SessionTimeout: cfg.Kafka.SessionTimeout, ExtraOpts: kopts,
			StartAtLatest: cfg.Kafka.StartOffset == "latest", MaxBatchRecords: cfg.Kafka.BatchMax,
		},
		Sender: notify.SenderConfig{
			From: cfg.Email.From, Owner: fmt.Sprintf("%s/%d", host, os.Getpid()), Policy: cfg.Email.UnknownPolicy,
			PollInterval: cfg.Email.PollInterval, SendingTimeout: cfg.Email.SendingTimeout, MaxAge: cfg.Email.MaxAge, Workers: cfg.Email.Senders,
			MaxAttempts: cfg.Email.MaxAttempts, BackoffBase: cfg.Email.BackoffBase, BackoffCap: cfg.Email.BackoffCap,
		},
		Mailer:            mailer,
		Orders:            notify.NewOrdersClient(cfg.OrdersAPIURL, cfg.OrdersAPIToken, cfg.OrdersAPITimeout),
		GapWindow:         cfg.GapWindow,
		Source:            cfg.OrdersEventSource,
		ResyncInterval:    min(max(cfg.GapWindow/4, 100*time.Millisecond), 5*time.Second),
		ProcessedEventTTL: cfg.Retention.ProcessedEventTTL,
		CleanupInterval:   cfg.Retention.CleanupInterval,
		CleanupBatch:      cfg.Retention.CleanupBatch,
		CleanupPause:      cfg.Retention.CleanupPause,
		StatsInterval:     5 * time.Second,
		Registerer:        reg,
		Logger:            log,
	})
	if err != nil {
		return err
	}

	srv := &http.Server{
		Addr:              cfg.HTTPAddr,
		Handler:           withAdmin(newHandler(pool, reg, schemaCheck, svc.Consumer.Health), svc.Admin(), cfg.Tokens, log),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	serverErr := make(chan error, 1)
	go func() { serverErr <- srv.ListenAndServe() }()

	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	workDone := make(chan error, 1)
	go func() {
		// Consuming into missing tables would fail every record; wait for
		// `notifier migrate` (readiness says what is missing meanwhile).
		last := time.Time{}
		err := schemaCheck.Wait(workCtx, 2*time.Second, func(err error) {
			if time.Since(last) > 30*time.Second {
				last = time.Now()
				log.Warn("waiting for the database schema; run `notifier migrate`", "reason", err.Error())
			}
		})
		if err != nil {
			workDone <- nil
			return
		}
		workDone <- svc.Run(workCtx)
	}()
	log.Info("notifier started", "http_addr", cfg.HTTPAddr, "topic", cfg.Kafka.Topic, "group", cfg.Kafka.Group,
		"unknown_policy", string(cfg.Email.UnknownPolicy), "pid", os.Getpid())

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutdown requested")
	case err := <-serverErr:
		runErr = fmt.Errorf("http server: %w", err)
	case err := <-workDone:
		workDone <- err
		runErr = fmt.Errorf("notifier stopped unexpectedly: %v", err)
		log.Error("notifier workers stopped; shutting down", "error", fmt.Sprint(err))
	}

	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("http shutdown incomplete", "error", err.Error())
	}
	stopWork()
	select {
	case err := <-workDone:
		if err != nil && runErr == nil {
			runErr = err
		}
	case <-shutdownCtx.Done():
		return errors.New("notifier did not stop within SHUTDOWN_TIMEOUT")
	}
	log.Info("notifier stopped")
	return runErr
}

// newHandler serves the unauthenticated operational endpoints (O3).
// Readiness reflects the database only: a broker outage stops consumption
// but is visible in the lag metric, and taking the notifier out of service
// would not help.
func newHandler(pool *pgxpool.Pool, reg *prometheus.Registry, schemaCheck *migrate.SchemaCheck, consumer func() notify.Health) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		// The consumer's own view is information, never a condition: a
		// degraded consumer is waiting for the database, which the status
		// reports anyway, and a stalled partition needs an operator, not a
		// restart.
		body := map[string]any{"status": "ok", "database": "ok", "consumer": "ok",
			"kafka": "not part of readiness; see notifier_consumer_lag"}
		h := consumer()
		if h.Degraded != "" {
			body["consumer"] = "degraded " + h.Degraded
		}
		if len(h.Stalled) > 0 {
			body["stalled_partitions"] = h.Stalled
		}
		status := http.StatusOK
		if err := pool.Ping(ctx); err != nil {
			status, body["status"], body["database"] = http.StatusServiceUnavailable, "unavailable", "unreachable"
		} else if err := schemaCheck.Check(ctx); err != nil {
			status, body["status"], body["schema"] = http.StatusServiceUnavailable, "unavailable", err.Error()+"; run `notifier migrate`"
		}
		writeJSON(w, status, body)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
