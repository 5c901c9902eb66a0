// Package notify is the order notifier: it consumes the orders service's
// events, keeps a projection of each order, and emails the customer once
// per order.placed, order.paid, order.cancelled and order.shipped.
//
// It is the downstream half of the outbox pattern and closes the windows
// that remain after the relay: an event delivered twice (the inbox, package
// inbox, absorbs it in the same local transaction as the projection and the
// email intent, C2), events out of order or missing (held, then resynced
// from the orders API, C3), a crash between the local commit and the offset
// commit (offsets are committed only after the local commit, C1, and the
// redelivery is a duplicate), and the non-idempotent email itself: the
// intent is a send-ledger row keyed by the event id, sent later outside any
// transaction, with 'unknown' for a send whose outcome was lost (C4).
package notify

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/orders/internal/inbox"
)

// Config is everything the notifier's workers need.
type Config struct {
	Consumer ConsumerConfig
	Sender   SenderConfig
	Mailer   Mailer
	// Orders resolves gaps: the orders API client.
	Orders *OrdersClient
	// GapWindow is how long a gap is held before a resync.
	GapWindow time.Duration
	// Source is the ce_source of the orders service's events; records with
	// another are parked (C7). DefaultSource when empty.
	Source string
	// ResyncInterval is how often overdue gaps are looked for.
	ResyncInterval time.Duration
	// ProcessedEventTTL is the inbox retention (checked against C5 by the
	// caller before start-up).
	ProcessedEventTTL time.Duration
	CleanupInterval   time.Duration
	CleanupBatch      int
	// CleanupPause is the wait between two cleanup batches, so a large
	// backlog of expired rows is removed without a burst of I/O.
	CleanupPause time.Duration
	// StatsInterval is how often gauges are refreshed from the database.
	StatsInterval time.Duration
	Registerer    prometheus.Registerer
	Logger        *slog.Logger
	// TracerProvider receives the consume, apply and send spans (L4),
	// unless Consumer or Sender name one of their own; nil means the
	// global provider.
	TracerProvider trace.TracerProvider
}

// Service wires the notifier's workers: the consumer, the email sender, the
// gap resync loop and the maintenance loop (retention cleanup, gauges).
type Service struct {
	cfg       Config
	pool      *pgxpool.Pool
	log       *slog.Logger
	Inbox     *inbox.Inbox
	Metrics   *Metrics
	Projector *Projector
	Sender    *Sender
	Consumer  *Consumer
	decode    inbox.DecodeFunc
}

// NewService builds the workers and registers their metrics.
func NewService(pool *pgxpool.Pool, cfg Config) (*Service, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	switch {
	case cfg.Mailer == nil:
		return nil, errors.New("notify: a Mailer is required")
	case cfg.Orders == nil:
		return nil, errors.New("notify: an orders API client is required for gap resync")
	case cfg.ResyncInterval <= 0 || cfg.StatsInterval <= 0 || cfg.CleanupInterval <= 0 || cfg.Sender.PollInterval <= 0:
		return nil, errors.New("notify: resync, stats, cleanup and sender poll intervals must be positive")
	case cfg.ProcessedEventTTL <= 0 || cfg.CleanupBatch <= 0:
		return nil, errors.New("notify: processed_event TTL and cleanup batch must be positive")
	}
	m, err := NewMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	if cfg.Source == "" {
		cfg.Source = DefaultSource
	}
	dec, err := NewDecoder(cfg.Source)
	if err != nil {
		return nil, err
	}
	if cfg.Consumer.Decode == nil {
		cfg.Consumer.Decode = dec.Decode
	}
	if cfg.Consumer.TracerProvider == nil {
		cfg.Consumer.TracerProvider = cfg.TracerProvider
	}
	if cfg.Sender.TracerProvider == nil {
		cfg.Sender.TracerProvider = cfg.TracerProvider
	}
	s := &Service{cfg: cfg, pool: pool, log: cfg.Logger, Metrics: m, decode: cfg.Consumer.Decode}
	s.Projector = NewProjector(cfg.Logger)
	ib, err := inbox.New(inbox.Config{
		Pool:          pool,
		Apply:         s.Projector.Apply,
		ApplyBatch:    s.Projector.ApplyBatch,
		Covered:       s.Projector.Covered,
		Rejected:      s.Projector.Rejected,
		Fetch:         cfg.Orders.Fetch,
		ApplySnapshot: s.Projector.ApplySnapshot,
		GapWindow:     cfg.GapWindow,
		ResyncRetry:   cfg.GapWindow,
		Registerer:    cfg.Registerer,
		Logger:        cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	ib.Metrics().InitEventTypes(EventTypes...)
	s.Inbox = ib
	s.Sender = NewSender(pool, cfg.Mailer, cfg.Sender, m, cfg.Logger)
	s.Consumer = NewConsumer(cfg.Consumer, pool, ib, m, cfg.Logger, func(applied []inbox.Event) {
		if len(applied) == 0 {
			s.Sender.Nudge()
		}
		for _, e := range applied {
			s.Sender.NudgeOrder(e.AggregateID) // an order's emails are in one worker's share
		}
	})
	return s, nil
}

// Run runs every worker until ctx is cancelled, then stops them in order:
// the consumer first (it finishes the batch in hand and commits its
// offsets), then the resync and maintenance loops, then the sender (it
// finishes the email in flight). An error of the consumer stops the rest.
func (s *Service) Run(ctx context.Context) error {
	consumerErr := make(chan error, 1)
	go func() { consumerErr <- s.Consumer.Run(ctx) }()

	bgCtx, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	senderCtx, stopSender := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBg()
	defer stopSender()
	var bg, sender sync.WaitGroup
	bg.Go(func() { s.resyncLoop(bgCtx) })
	bg.Go(func() { s.maintenanceLoop(bgCtx) })
	sender.Go(func() { _ = s.Sender.Run(senderCtx) })

	err := <-consumerErr
	stopBg()
	bg.Wait()
	stopSender()
	sender.Wait()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func (s *Service) resyncLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.ResyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		done, err := s.Inbox.ResyncDue(ctx, 100)
		if err != nil && ctx.Err() == nil {
			s.log.ErrorContext(ctx, "gap resync pass failed", slog.String("error", err.Error()))
		}
		if len(done) > 0 {
			s.Sender.Nudge()
		}
	}
}

func (s *Service) maintenanceLoop(ctx context.Context) {
	stats := time.NewTicker(s.cfg.StatsInterval)
	defer stats.Stop()
	cleanup := time.NewTicker(s.cfg.CleanupInterval)
	defer cleanup.Stop()
	s.refreshStats(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-stats.C:
			s.refreshStats(ctx)
		case <-cleanup.C:
			n, err := s.Inbox.Cleanup(ctx, s.cfg.ProcessedEventTTL, s.cfg.CleanupBatch, s.cfg.CleanupPause)
			s.Metrics.CleanupDeleted.WithLabelValues("processed_event").Add(float64(n))
			if err != nil && ctx.Err() == nil {
				s.log.ErrorContext(ctx, "processed_event cleanup failed", slog.String("error", err.Error()))
			} else if n > 0 {
				s.log.InfoContext(ctx, "processed_event cleanup", slog.Int64("deleted", n), slog.Duration("ttl", s.cfg.ProcessedEventTTL))
			}
			n, err = CleanupLedger(ctx, s.pool, s.cfg.ProcessedEventTTL, s.cfg.CleanupBatch, s.cfg.CleanupPause)
			s.Metrics.CleanupDeleted.WithLabelValues("email_send").Add(float64(n))
			if err != nil && ctx.Err() == nil {
				s.log.ErrorContext(ctx, "email ledger cleanup failed", slog.String("error", err.Error()))
			} else if n > 0 {
				s.log.InfoContext(ctx, "email ledger cleanup", slog.Int64("deleted", n))
			}
		}
	}
}

func (s *Service) refreshStats(ctx context.Context) {
	start := time.Now()
	st, err := s.Inbox.RefreshStats(ctx)
	if err == nil {
		err = RefreshLedgerStats(ctx, s.pool, s.Metrics)
	}
	if err != nil {
		if ctx.Err() == nil {
			s.log.WarnContext(ctx, "refresh gauges failed", slog.String("error", err.Error()))
		}
		return
	}
	// Every StatsInterval, so debug only: what the refresh costs, for an
	// operator checking that it stays cheap as the tables grow.
	s.log.DebugContext(ctx, "gauges refreshed", slog.Duration("took", time.Since(start)),
		slog.Int64("held", st.Held), slog.Int64("parked_events", st.ParkedEvents), slog.Int64("parked_records", st.ParkedRecords),
		slog.Int64("gaps_overdue", st.GapsOverdue))
}
