package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.yaml.in/yaml/v3"

	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/envconfig"
	"github.com/outboxref/orders/internal/orders"
	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
	"github.com/outboxref/orders/internal/outbox/operate"
)

// OperationsConfig is the retention cleanup and the replay policy (O5, O6).
type OperationsConfig struct {
	// OutboxRetention is how long a delivered row stays replayable before
	// the cleanup archives it (identity and broker position only).
	OutboxRetention time.Duration // OUTBOX_RETENTION
	// IdempotencyKeyRetention must exceed how long clients retry a create.
	IdempotencyKeyRetention time.Duration // IDEMPOTENCY_KEY_RETENTION
	CleanupInterval         time.Duration // CLEANUP_INTERVAL
	CleanupBatch            int           // CLEANUP_BATCH
	CleanupPause            time.Duration // CLEANUP_PAUSE
	// ReplayApprovalThreshold: a replay that takes an admin's events over
	// this many within ReplayApprovalWindow needs a second admin (a
	// time-range replay always does).
	ReplayApprovalThreshold int           // REPLAY_APPROVAL_THRESHOLD
	ReplayApprovalWindow    time.Duration // REPLAY_APPROVAL_WINDOW
	// ReplayApprovalTTL is how long a second admin's approval allows a run.
	ReplayApprovalTTL time.Duration // REPLAY_APPROVAL_TTL
	ReplayRate        float64       // REPLAY_RATE: events per second
	// ReplayConsumersFile is the consumer registry (YAML): who reads the
	// events, their inbox retention, their side effects.
	ReplayConsumersFile string // REPLAY_CONSUMERS_FILE
}

func loadOperations(r *envconfig.Reader) OperationsConfig {
	c := OperationsConfig{
		OutboxRetention:         r.Duration("OUTBOX_RETENTION", 7*24*time.Hour),
		IdempotencyKeyRetention: r.Duration("IDEMPOTENCY_KEY_RETENTION", 24*time.Hour),
		CleanupInterval:         r.Duration("CLEANUP_INTERVAL", time.Hour),
		CleanupBatch:            r.Int("CLEANUP_BATCH", 1000, 1, 100_000),
		CleanupPause:            r.Duration("CLEANUP_PAUSE", 100*time.Millisecond),
		ReplayApprovalThreshold: r.Int("REPLAY_APPROVAL_THRESHOLD", 100, 0, 1_000_000),
		ReplayApprovalWindow:    r.Duration("REPLAY_APPROVAL_WINDOW", 24*time.Hour),
		ReplayApprovalTTL:       r.Duration("REPLAY_APPROVAL_TTL", time.Hour),
		ReplayRate:              float64(r.Int("REPLAY_RATE", 100, 1, 100_000)),
		ReplayConsumersFile:     r.String("REPLAY_CONSUMERS_FILE", ""),
	}
	if c.OutboxRetention <= 0 || c.IdempotencyKeyRetention <= 0 || c.CleanupInterval <= 0 {
		r.Fail("OUTBOX_RETENTION, IDEMPOTENCY_KEY_RETENTION and CLEANUP_INTERVAL must be positive")
	}
	if c.ReplayApprovalWindow <= 0 || c.ReplayApprovalTTL <= 0 {
		r.Fail("REPLAY_APPROVAL_WINDOW and REPLAY_APPROVAL_TTL must be positive")
	}
	// The registry file is read, and refused if malformed, when serve
	// starts: a configuration check may run where the file is not.
	return c
}

func (c OperationsConfig) print(w io.Writer) {
	fmt.Fprintf(w, "config: OUTBOX_RETENTION=%s IDEMPOTENCY_KEY_RETENTION=%s CLEANUP_INTERVAL=%s CLEANUP_BATCH=%d CLEANUP_PAUSE=%s REPLAY_APPROVAL_THRESHOLD=%d REPLAY_APPROVAL_WINDOW=%s REPLAY_APPROVAL_TTL=%s REPLAY_RATE=%g REPLAY_CONSUMERS_FILE=%s\n",
		c.OutboxRetention, c.IdempotencyKeyRetention, c.CleanupInterval, c.CleanupBatch, c.CleanupPause,
		c.ReplayApprovalThreshold, c.ReplayApprovalWindow, c.ReplayApprovalTTL, c.ReplayRate, c.ReplayConsumersFile)
}

// consumerRegistry is the file format of REPLAY_CONSUMERS_FILE.
type consumerRegistry struct {
	Consumers []struct {
		Name           string            `yaml:"name"`
		EventTypes     []string          `yaml:"event_types"`
		InboxRetention string            `yaml:"inbox_retention"`
		SideEffects    map[string]string `yaml:"side_effects"`
	} `yaml:"consumers"`
}

// loadConsumers reads the consumer registry.
func loadConsumers(path string) ([]operate.Consumer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read consumer registry: %w", err)
	}
	var reg consumerRegistry
	if err := yaml.Unmarshal(b, &reg); err != nil {
		return nil, fmt.Errorf("parse consumer registry %s: %w", path, err)
	}
	out := make([]operate.Consumer, 0, len(reg.Consumers))
	for _, c := range reg.Consumers {
		ret, err := time.ParseDuration(c.InboxRetention)
		if c.Name == "" || err != nil || ret <= 0 {
			return nil, fmt.Errorf("consumer registry %s: each consumer needs a name and an inbox_retention such as 720h", path)
		}
		out = append(out, operate.Consumer{Name: c.Name, EventTypes: c.EventTypes, InboxRetention: ret, SideEffects: c.SideEffects})
	}
	return out, nil
}

// operations is the orders service's part of operating the outbox: the
// admin API over operate.Admin, the producer replays and the direct path
// use, the replays' resumption, and the cleanup.
type operations struct {
	// writer is the process's one outbox Writer: the orders service writes
	// its events with it and admin checks repairs with it. Its direct
	// publisher is directPublish (O7).
	writer  *outbox.Writer
	admin   *operate.Admin
	keys    *orders.KeyCleanup
	handler http.Handler
	policy  operate.ReplayPolicy
	cfg     Config
	log     *slog.Logger

	mu       sync.Mutex
	producer *kgo.Client // created on the first replay run
}

// newOperations builds the admin API and registers the cleanup metrics.
// ctx bounds replay runs and the cleanup loop.
func newOperations(ctx context.Context, cfg Config, pool *pgxpool.Pool, log *slog.Logger, reg prometheus.Registerer) (*operations, error) {
	ops, err := newReplayer(cfg, pool, log)
	if err != nil {
		return nil, err
	}
	ops.keys = orders.NewKeyCleanup(pool)
	if err := reg.Register(ops.admin.Collector()); err != nil {
		return nil, fmt.Errorf("register outbox cleanup metrics: %w", err)
	}
	if err := reg.Register(ops.keys.Collector()); err != nil {
		return nil, fmt.Errorf("register orders cleanup metrics: %w", err)
	}
	if cfg.Ops.ReplayConsumersFile != "" {
		consumers, err := loadConsumers(cfg.Ops.ReplayConsumersFile)
		if err != nil {
			return nil, fmt.Errorf("REPLAY_CONSUMERS_FILE: %w", err)
		}
		ops.policy.Consumers = consumers
	}
	ops.handler = ops.admin.Handler(operate.AdminHandlerConfig{
		Actor: func(r *http.Request) string {
			p, _ := auth.FromContext(r.Context())
			return p.Subject
		},
		Policy:     ops.policy,
		Target:     ops.replayTarget,
		Background: ctx,
		Log:        log,
	})
	return ops, nil
}

// newReplayer is the part of operations that `orders relay` has too: the
// outbox operations, with the order events' repair check, and what a
// replay needs to run. A running plan is leased for RELAY_LEASE, as the
// relay's claimed rows are: the same time after which a dead process's
// work is taken over.
func newReplayer(cfg Config, pool *pgxpool.Pool, log *slog.Logger) (*operations, error) {
	o := &operations{
		policy: operate.ReplayPolicy{
			ApprovalThreshold: cfg.Ops.ReplayApprovalThreshold,
			ApprovalWindow:    cfg.Ops.ReplayApprovalWindow,
			ApprovalTTL:       cfg.Ops.ReplayApprovalTTL,
			RunLease:          cfg.Relay.Lease,
		},
		cfg: cfg,
		log: log,
	}
	// The Writer is built here, not passed in, because its direct publisher
	// is this value's producer. Under `orders relay`, which runs no
	// commands, only its checks are used.
	writer, err := outbox.NewWriter(orderEventTypes(), outbox.WithDirectPublisher(o.directPublish))
	if err != nil {
		return nil, err
	}
	o.writer = writer
	o.admin = operate.NewAdmin(pool, writer, operate.WithRepairCheck(orders.CheckRepair))
	return o, nil
}

// resumeReplays continues, until ctx ends, the replays whose runner
// stopped (interrupted by a shutdown, or killed): the process that starts
// next, or any other one running, takes them over.
func (o *operations) resumeReplays(ctx context.Context) {
	o.admin.ResumeReplays(ctx, o.policy, o.replayTarget, o.log)
}

// stopReplays waits, within ctx, for the replays this process runs to
// record where they stopped; the caller has ended their context.
func (o *operations) stopReplays(ctx context.Context) {
	if err := o.admin.WaitReplays(ctx); err != nil {
		o.log.Warn("replays did not stop in time; they continue after their lease", "error", err.Error())
	}
}

// replayTarget is where replays publish: the topic, through producer.
func (o *operations) replayTarget(context.Context) (operate.ReplayTarget, error) {
	cl, err := o.client()
	if err != nil {
		return operate.ReplayTarget{}, err
	}
	return operate.ReplayTarget{Client: cl, Topic: o.cfg.Kafka.Topic, Source: o.cfg.Relay.Source, Rate: o.cfg.Ops.ReplayRate}, nil
}

// directSendTimeout bounds one send of the direct path, which a request
// waits for with its transaction open.
const directSendTimeout = 5 * time.Second

// directPublish is the legacy path of the publish-mode migration (O7):
// it sends an event from inside the command's open transaction and waits
// for the broker, which is the dual write the outbox removes. It runs only
// for event types an operator switched to direct or shadow mode, to let a
// deployment that used to publish this way move to the outbox type by
// type. It builds the record as the relay does, so shadow mode should
// find no difference; a service with its own legacy encoder puts it here.
func (o *operations) directPublish(ctx context.Context, e outbox.Event, createdAt time.Time) (*kgo.Record, error) {
	cl, err := o.client()
	if err != nil {
		return nil, err
	}
	rec := cloudevents.Record(o.cfg.Kafka.Topic, cloudevents.Event{
		ID: e.ID, Type: e.Type, Source: o.cfg.Relay.Source, Time: createdAt,
		AggregateType: e.AggregateType, AggregateID: e.AggregateID, AggregateVersion: e.AggregateVersion,
		SchemaVersion: e.SchemaVersion, Traceparent: e.Traceparent, Tracestate: e.Tracestate, Data: e.Payload,
	})
	ctx, cancel := context.WithTimeout(ctx, directSendTimeout)
	defer cancel()
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return nil, err
	}
	return rec, nil
}

// client creates, once, the producer that replays and the direct path
// share: the relay's producer guarantees, a client of its own.
func (o *operations) client() (*kgo.Client, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.producer == nil {
		conn, err := o.cfg.Kafka.Conn.Options()
		if err != nil {
			return nil, err
		}
		cl, err := kgo.NewClient(append(conn,
			kgo.DefaultProduceTopic(o.cfg.Kafka.Topic),
			kgo.RequiredAcks(kgo.AllISRAcks()),
			kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
			kgo.ProducerBatchMaxBytes(int32(o.cfg.Kafka.MaxMessageBytes)),
		)...)
		if err != nil {
			return nil, err
		}
		o.producer = cl
	}
	return o.producer, nil
}

// runCleanup archives delivered outbox rows and deletes idempotency keys
// past their retention, every CLEANUP_INTERVAL, until ctx ends. The
// outbox's retention is its own loop (operate.Admin.RunCleanup); the
// idempotency keys are the service's table, cleaned here on the same
// schedule. Every process may run both: a run that finds another running
// returns at once.
func (o *operations) runCleanup(ctx context.Context) {
	c := o.cfg.Ops
	go o.admin.RunCleanup(ctx, operate.Cleanup{Retention: c.OutboxRetention, BatchSize: c.CleanupBatch, Pause: c.CleanupPause}, c.CleanupInterval, o.log)
	t := time.NewTimer(min(c.CleanupInterval, time.Minute)) // not at start-up, when restarts cluster
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := o.keys.Run(ctx, c.IdempotencyKeyRetention, c.CleanupBatch, c.CleanupPause); err != nil {
			if ctx.Err() == nil {
				o.log.ErrorContext(ctx, "idempotency key cleanup failed", "error", err.Error())
			}
		} else if n > 0 {
			o.log.InfoContext(ctx, "idempotency key cleanup", "deleted", n, "retention", c.IdempotencyKeyRetention.String())
		}
		t.Reset(c.CleanupInterval)
	}
}

// close releases the replay producer.
func (o *operations) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.producer != nil {
		o.producer.Close()
	}
}
