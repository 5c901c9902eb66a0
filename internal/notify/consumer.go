package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/orders/internal/failpoint"
	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/notify/notifydb"
)

// ConsumerConfig configures the Kafka side of the Consumer.
type ConsumerConfig struct {
	Brokers []string
	Topic   string
	Group   string
	// InstanceID enables static membership: a restarted instance takes its
	// partitions back without a rebalance. Empty means dynamic membership.
	InstanceID string
	// SessionTimeout is how long the group waits for a silent member.
	SessionTimeout time.Duration
	// MaxPollRecords bounds the records taken from one poll; their offsets
	// are committed together once all of them are processed. Zero means
	// MaxBatchRecords, and at least 100.
	MaxPollRecords int
	// MaxBatchRecords bounds the records applied in one local transaction
	// (DefaultMaxBatchRecords when zero). A larger batch saves commits but
	// holds its aggregates' inbox locks longer and must finish within the
	// transaction's deadline; 1 gives one transaction per record.
	MaxBatchRecords int
	// StartAtLatest makes a group without committed offsets start at the
	// end of the topic instead of its beginning. The default (beginning)
	// lets the notifier catch up on events published before it first ran;
	// emails of events older than EMAIL_MAX_AGE are skipped, not sent.
	StartAtLatest bool
	// MaxApplyAttempts bounds the attempts for a record whose processing
	// fails with an error that retrying cannot fix (a constraint violation,
	// a bug): it is then parked so it does not block its partition
	// forever (C6). Infrastructure errors (connection, timeout, deadlock)
	// are retried without limit, since parking would lose good events.
	MaxApplyAttempts int
	// RetryCap bounds the wait between attempts while the database is
	// unreachable (exponential from 100ms). Zero means 5s.
	RetryCap time.Duration
	// LagInterval is how often the lag is read from the broker's end
	// offsets. Zero means 15s.
	LagInterval time.Duration
	// StallAfter reports a partition as stalled when it has a lag and its
	// committed offset has not moved for this long. Zero means 2m.
	StallAfter time.Duration
	// ExtraOpts are added to the client (TLS, SASL, test tuning).
	ExtraOpts []kgo.Opt
	// Decode turns a record into an event, or refuses it (the record is
	// then parked). Nil means DecodeRecord.
	Decode inbox.DecodeFunc
	// TracerProvider receives the consume and apply spans (L4); nil means
	// the global provider.
	TracerProvider trace.TracerProvider
}

// DefaultMaxBatchRecords is the default bound on the records applied in one
// local transaction: enough to spread the cost of a commit (a WAL flush)
// over many records, small enough that the transaction stays well under a
// second and its row locks short.
const DefaultMaxBatchRecords = 200

// The bounds of one fetch (see Run). ExtraOpts may override them.
const (
	fetchMaxBytes          = 1 << 20
	fetchMaxPartitionBytes = 1 << 20
	// Under a steady stream the broker holds a fetch until this many bytes
	// (some tens of order events) are ready or fetchLinger has passed, so
	// each local transaction carries a batch instead of a record or two: a
	// batch costs about the same statements whatever its size. An idle
	// topic delays an event by at most fetchLinger.
	fetchMinBytes = 64 << 10
	fetchLinger   = 20 * time.Millisecond
)

// Consumer reads order events from Kafka and runs them through the inbox
// in local transactions (C1, C2). The records of one poll are applied in
// batches, each in one transaction; a batch that fails for a reason of its
// own is rolled back as a whole and its records are applied again one
// transaction each, so a single bad record never holds back its
// neighbours: it is parked (C6). Offsets are committed only for records
// whose transaction committed, so a crash at any point redelivers, and the
// inbox absorbs, whatever was not committed.
//
// An infrastructure failure (the database unreachable) says nothing about
// the records: they are kept in memory, their partitions are paused, and
// the consumer keeps polling between attempts with capped backoff, which
// keeps its place in the group and lets rebalances through. It reports
// itself degraded meanwhile and, once the database answers, resumes with
// the records it kept: nothing committed is processed again.
type Consumer struct {
	cfg     ConsumerConfig
	pool    *pgxpool.Pool
	inbox   *inbox.Inbox
	metrics *Metrics
	log     *slog.Logger
	tracer  trace.Tracer
	// onApplied is called with the events a committed transaction
	// applied; the notifier nudges its sender there.
	onApplied func([]inbox.Event)

	mu sync.Mutex
	// done holds, per partition, the last record whose local transaction
	// committed but whose offset is not committed yet.
	done map[topicPartition]*kgo.Record
	// backlog holds polled records not processed yet because the database
	// failed; they are retried before anything else.
	backlog []*kgo.Record
	crashed bool
	health  health

	// afterLocalCommit, when set, runs for each record that went through
	// the inbox, after the local transaction holding it (its own or its
	// batch's) committed and before its offset is marked; an error stops
	// the consumer as a crash would (tests only).
	afterLocalCommit func(*kgo.Record) error
}

type topicPartition struct {
	topic     string
	partition int32
}

func (tp topicPartition) String() string { return tp.topic + "/" + strconv.Itoa(int(tp.partition)) }

// health is what the consumer reports about itself on /readyz.
type health struct {
	degradedSince time.Time // zero when healthy
	degradedCause string
	stalled       []string
	lastCommit    map[topicPartition]progress
}

type progress struct {
	offset int64
	since  time.Time
}

// Health is the consumer's view of itself, for /readyz information. It
// never decides readiness: the database does.
type Health struct {
	// Degraded says, when not empty, since when and why the consumer is
	// waiting out an infrastructure failure.
	Degraded string
	// Stalled lists partitions with a lag and no committed progress for
	// the stall threshold.
	Stalled []string
}

// errCrashed is returned by Run when a test hook simulated a crash.
var errCrashed = errors.New("consumer crashed (simulated)")

// NewConsumer returns a Consumer. onApplied may be nil.
func NewConsumer(cfg ConsumerConfig, pool *pgxpool.Pool, ib *inbox.Inbox, m *Metrics, log *slog.Logger, onApplied func([]inbox.Event)) *Consumer {
	if cfg.MaxBatchRecords <= 0 {
		cfg.MaxBatchRecords = DefaultMaxBatchRecords
	}
	if cfg.Decode == nil {
		cfg.Decode = DecodeRecord
	}
	if cfg.MaxPollRecords <= 0 {
		// At least 100, so that small batches do not mean one offset
		// commit (a broker round trip) per batch.
		cfg.MaxPollRecords = max(cfg.MaxBatchRecords, 100)
	}
	if cfg.MaxApplyAttempts <= 0 {
		cfg.MaxApplyAttempts = 5
	}
	if cfg.RetryCap <= 0 {
		cfg.RetryCap = 5 * time.Second
	}
	if cfg.LagInterval <= 0 {
		cfg.LagInterval = 15 * time.Second
	}
	if cfg.StallAfter <= 0 {
		cfg.StallAfter = 2 * time.Minute
	}
	if log == nil {
		log = slog.Default()
	}
	if onApplied == nil {
		onApplied = func([]inbox.Event) {}
	}
	return &Consumer{cfg: cfg, pool: pool, inbox: ib, metrics: m, log: log, tracer: tracerOf(cfg.TracerProvider), onApplied: onApplied,
		done: map[topicPartition]*kgo.Record{}, health: health{lastCommit: map[topicPartition]progress{}}}
}

// Health reports whether the consumer is degraded and which partitions are
// stalled.
func (c *Consumer) Health() Health {
	c.mu.Lock()
	defer c.mu.Unlock()
	var h Health
	if !c.health.degradedSince.IsZero() {
		h.Degraded = fmt.Sprintf("since %s: %s", c.health.degradedSince.UTC().Format(time.RFC3339), c.health.degradedCause)
	}
	h.Stalled = slices.Clone(c.health.stalled)
	return h
}

// Run consumes until ctx is cancelled, then finishes the batch in hand,
// commits the offsets of everything processed and leaves the group. It
// never creates the topic.
func (c *Consumer) Run(ctx context.Context) error {
	start := kgo.NewOffset().AtStart()
	if c.cfg.StartAtLatest {
		start = kgo.NewOffset().AtEnd()
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.cfg.Brokers...),
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topic),
		kgo.ConsumeResetOffset(start),
		// Offsets are committed by hand, after the local commit (C1).
		kgo.DisableAutoCommit(),
		// A rebalance waits until the current batch is processed and its
		// offsets committed, so partitions never move with work in hand.
		// Waiting out a database failure releases the poll between
		// attempts, so a rebalance is never blocked for long.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
		// Bounded fetch buffers: a backlog must not become memory. The
		// client's defaults allow 50 MiB per fetch and one buffered fetch
		// per broker; 1 MiB per fetch (over a thousand order events, several
		// batches) keeps the consumer busy between polls, and at most two
		// fetches in flight or buffered cap what a backlog of any size costs
		// in RAM. 4 MiB was no faster and cost 25 MiB more at the peak.
		kgo.FetchMaxBytes(fetchMaxBytes),
		kgo.FetchMaxPartitionBytes(fetchMaxPartitionBytes),
		kgo.MaxConcurrentFetches(2),
		kgo.FetchMinBytes(fetchMinBytes),
		kgo.FetchMaxWait(fetchLinger),
	}
	if c.cfg.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(c.cfg.SessionTimeout))
	}
	if c.cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(c.cfg.InstanceID))
	}
	opts = append(opts, c.cfg.ExtraOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("create kafka consumer: %w", err)
	}
	defer func() {
		cl.AllowRebalance()
		cl.Close()
	}()
	lagCtx, stopLag := context.WithCancel(ctx)
	defer stopLag()
	go c.watchLag(lagCtx, cl)

	delay := time.Duration(0) // wait before the next attempt at the backlog
	var retryAt time.Time
	for ctx.Err() == nil {
		pollCtx, cancel := ctx, context.CancelFunc(func() {})
		if c.backlogLen() > 0 {
			// Waiting out a failure: poll (for unpaused partitions, and to
			// let rebalances through) at most until the next attempt.
			pollCtx, cancel = context.WithDeadline(ctx, retryAt)
		}
		fetches := cl.PollRecords(pollCtx, c.cfg.MaxPollRecords)
		cancel()
		if fetches.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				c.log.WarnContext(ctx, "kafka fetch error", slog.String("topic", topic), slog.Int("partition", int(p)), slog.String("error", err.Error()))
			}
		})
		// EachRecord yields each partition's records in offset order; the
		// backlog keeps it, and a batch keeps it: the inbox needs it for the
		// versions of one aggregate (one key, one partition), and the
		// offset marked for a partition is then always its last processed
		// record.
		c.mu.Lock()
		fetches.EachRecord(func(r *kgo.Record) { c.backlog = append(c.backlog, r) })
		c.mu.Unlock()

		if time.Now().After(retryAt) {
			err := c.drainBacklog(ctx)
			switch {
			case errors.Is(err, errCrashed):
				return err
			case err != nil && ctx.Err() == nil:
				delay = min(max(2*delay, 100*time.Millisecond), c.cfg.RetryCap)
				retryAt = time.Now().Add(delay)
				c.degrade(ctx, cl, err, delay)
			case err == nil:
				delay, retryAt = 0, time.Time{}
				c.recover(ctx, cl)
			}
		}
		c.commitDone(ctx, cl)
		cl.AllowRebalance()
	}
	c.commitDone(ctx, cl)
	return nil
}

func (c *Consumer) backlogLen() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.backlog)
}

// drainBacklog processes the backlog in batches of MaxBatchRecords, a batch
// possibly spanning partitions, removing each record once it is handled. It
// stops at the first infrastructure failure, keeping the rest, and between
// batches when the consumer is stopping (the rest is redelivered to the
// next owner).
func (c *Consumer) drainBacklog(ctx context.Context) error {
	for ctx.Err() == nil {
		c.mu.Lock()
		n := min(len(c.backlog), c.cfg.MaxBatchRecords)
		batch := slices.Clone(c.backlog[:n])
		c.mu.Unlock()
		if n == 0 {
			return nil
		}
		done, err := c.processBatch(ctx, batch)
		c.mu.Lock()
		// A rebalance callback may have dropped records meanwhile; remove
		// exactly the handled ones.
		handled := map[*kgo.Record]bool{}
		for _, r := range batch[:done] {
			handled[r] = true
		}
		c.backlog = slices.DeleteFunc(c.backlog, func(r *kgo.Record) bool { return handled[r] })
		c.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// degrade pauses the partitions of the kept records and reports the
// failure, once per failure and then now and then.
func (c *Consumer) degrade(ctx context.Context, cl *kgo.Client, cause error, retryIn time.Duration) {
	c.mu.Lock()
	pause := map[string][]int32{}
	seen := map[topicPartition]bool{}
	for _, r := range c.backlog {
		tp := topicPartition{r.Topic, r.Partition}
		if !seen[tp] {
			seen[tp] = true
			pause[r.Topic] = append(pause[r.Topic], r.Partition)
		}
	}
	first := c.health.degradedSince.IsZero()
	if first {
		c.health.degradedSince = time.Now()
	}
	c.health.degradedCause = cause.Error()
	kept := len(c.backlog)
	c.mu.Unlock()
	cl.PauseFetchPartitions(pause)
	c.metrics.Degraded.Set(1)
	c.metrics.ConsumeErrors.Inc()
	if first || retryIn == c.cfg.RetryCap {
		c.log.WarnContext(ctx, "consumer degraded: the database failed; records kept, partitions paused, retrying with backoff",
			slog.String("error", cause.Error()), slog.Int("records_kept", kept), slog.Duration("retry_in", retryIn))
	}
}

// recover resumes every paused partition once the backlog is empty.
func (c *Consumer) recover(ctx context.Context, cl *kgo.Client) {
	c.mu.Lock()
	was := c.health.degradedSince
	c.health.degradedSince, c.health.degradedCause = time.Time{}, ""
	c.mu.Unlock()
	if paused := cl.PauseFetchPartitions(nil); len(paused) > 0 {
		cl.ResumeFetchPartitions(paused)
	}
	if !was.IsZero() {
		c.metrics.Degraded.Set(0)
		c.log.InfoContext(ctx, "consumer recovered: the records kept are processed; partitions resumed",
			slog.Duration("degraded_for", time.Since(was).Round(time.Millisecond)))
	}
}

// batchItem is one record of a committed batch and what became of it.
type batchItem struct {
	rec   *kgo.Record
	event inbox.Event
	res   inbox.Result
	// parked is why a record that could not be decoded was parked in the
	// batch's transaction; empty for a record that went through the inbox.
	parked string
	stored bool // the parking stored a new row (not a redelivered one)
	// span is the record's consume span; finish ends it.
	span trace.Span
}

// processBatch applies recs in one local transaction and then, record by
// record and only after the commit, reports each one (metrics, logs) and
// marks its offset. If the transaction fails for a reason of a record, or
// of none in particular, nothing of it is kept (V4 holds for the whole
// batch) and the records are applied again one transaction each, with the
// per-record retry and parking rules. That fallback is what keeps one
// poison record from rolling back its neighbours forever; it costs one
// slow batch, not a blocked partition. An infrastructure failure is
// returned as it is, with the number of leading records handled.
func (c *Consumer) processBatch(ctx context.Context, recs []*kgo.Record) (done int, err error) {
	if len(recs) == 1 {
		if err := c.processWithRetry(ctx, recs[0], nil); err != nil {
			return 0, err
		}
		return 1, nil
	}
	// Like a single record's, the batch's transaction is not cancelled by
	// shutdown: it is short, and finishing it lets its offsets be
	// committed. A batch that outlives the deadline fails with a transient
	// error and is retried.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	items, failed, err := c.applyBatch(tctx, recs)
	switch {
	case err == nil:
		for i, it := range items {
			if err := c.finish(tctx, it); err != nil {
				return i, err
			}
		}
		return len(recs), nil
	case inbox.IsTransient(err):
		return 0, err
	}
	attrs := []any{slog.Int("batch_size", len(recs)), slog.String("error", err.Error())}
	if failed >= 0 {
		r := recs[failed]
		attrs = append(attrs, slog.String("topic", r.Topic), slog.Int("partition", int(r.Partition)), slog.Int64("offset", r.Offset))
	}
	c.log.WarnContext(ctx, "batch transaction rolled back; applying its records one transaction each", attrs...)
	// The record that failed the batch has spent its first attempt there,
	// so a record that keeps failing is still parked after
	// MaxApplyAttempts attempts in all.
	for i, r := range recs {
		var prior error
		if i == failed && !parkable(err) {
			prior = err
		}
		if perr := c.processWithRetry(ctx, r, prior); perr != nil {
			return i, perr
		}
	}
	return len(recs), nil
}

// applyBatch runs recs, in order, through the inbox in one local
// transaction. Each Process call sees the writes of the earlier ones, so
// two events of one aggregate in a batch behave as in two transactions.
// A record that cannot be decoded is parked in the same transaction.
// Nothing is reported here: the caller does that once the transaction has
// committed. On failure everything is rolled back, and failed is the index
// of the record being processed, or -1 when the failure was no record's
// (begin, commit).
func (c *Consumer) applyBatch(ctx context.Context, recs []*kgo.Record) (items []batchItem, failed int, err error) {
	failed = -1
	var spans []trace.Span
	defer func() {
		// Rolled back: nothing of these records was kept. Their retry,
		// alone or in the next batch, gets spans of its own.
		if err != nil {
			for _, s := range spans {
				failSpan(s, err)
				s.End()
			}
		}
	}()
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		items = items[:0]
		// Undecodable records are parked here; the others go through the
		// inbox together, so that it can take the batch set-based.
		var events []inbox.Event
		var ctxs []context.Context
		var at []int // the index in items (and recs) of each event
		for i, r := range recs {
			e, derr := c.cfg.Decode(r)
			rctx, span := c.startConsume(ctx, r, e)
			spans = append(spans, span)
			if parkable(derr) {
				stored, err := inbox.ParkRecord(rctx, tx, r, derr.Error())
				if err != nil {
					failed = i
					return err
				}
				items = append(items, batchItem{rec: r, event: e, parked: derr.Error(), stored: stored, span: span})
				continue
			}
			items = append(items, batchItem{rec: r, event: e, span: span})
			events, ctxs, at = append(events, e), append(ctxs, rctx), append(at, i)
		}
		results, err := c.applyAll(ctx, tx, events, ctxs)
		if err != nil {
			if ee, ok := errors.AsType[*inbox.EventError](err); ok && ee.Index >= 0 && ee.Index < len(at) {
				failed = at[ee.Index]
			}
			return err
		}
		for j, res := range results {
			items[at[j]].res = res
		}
		failpoint.Inject(failpoint.NotifierBeforeLocalCommit)
		return nil
	})
	if err != nil {
		return nil, failed, err
	}
	return items, -1, nil
}

// applyAll runs events through the inbox inside the caller's transaction
// (inbox.ProcessBatch), each in an apply span of its own, a child of its
// record's consume span (ctxs, in the same order). The inbox handles the
// events together, so each span covers the batch's inbox work, not only
// the event's part; the commit is the batch's and is in none of them.
func (c *Consumer) applyAll(ctx context.Context, tx pgx.Tx, events []inbox.Event, ctxs []context.Context) ([]inbox.Result, error) {
	spans := make([]trace.Span, len(events))
	for i, e := range events {
		_, spans[i] = c.tracer.Start(ctxs[i], "inbox apply", trace.WithAttributes(
			attribute.String("event.id", e.ID.String()),
			attribute.String("event.type", e.Type),
			attribute.Int("inbox.batch_size", len(events)),
		))
	}
	results, err := c.inbox.ProcessBatch(ctx, tx, events)
	for i, span := range spans {
		if err != nil {
			failSpan(span, err)
		} else {
			span.SetAttributes(attribute.String("inbox.outcome", string(results[i].Outcome)), attribute.Int("inbox.applied", len(results[i].Applied)))
		}
		span.End()
	}
	return results, err
}

// parkable reports whether err means the record can never be processed:
// it is parked at once rather than retried.
func parkable(err error) bool {
	return errors.Is(err, errPoison) || errors.Is(err, inbox.ErrInvalidEvent)
}

// processWithRetry handles one record in a transaction of its own until it
// is processed or parked. A failure that retrying cannot fix is retried
// MaxApplyAttempts times and then parked. An infrastructure failure (the
// database is down, a deadlock) is returned at once: the caller keeps the
// record and waits it out without blocking the group. A non-nil prior is
// the outcome of the record's first attempt, made in a batch that failed on
// it.
func (c *Consumer) processWithRetry(ctx context.Context, r *kgo.Record, prior error) error {
	delay := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := prior
		if attempt > 1 || prior == nil {
			err = c.process(ctx, r)
		}
		if err == nil || errors.Is(err, errCrashed) || inbox.IsTransient(err) {
			return err
		}
		c.metrics.ConsumeErrors.Inc()
		c.log.ErrorContext(ctx, "processing record failed; retrying", slog.String("topic", r.Topic), slog.Int("partition", int(r.Partition)),
			slog.Int64("offset", r.Offset), slog.Int("attempt", attempt), slog.String("error", err.Error()))
		if attempt >= c.cfg.MaxApplyAttempts {
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			return c.park(pctx, r, fmt.Errorf("processing failed %d times: %w", attempt, err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, 2*time.Second)
	}
}

// process handles one record: decode, then one local transaction through
// the inbox (or parking), then the offset is marked for commit.
func (c *Consumer) process(ctx context.Context, r *kgo.Record) error {
	// The local transaction is not cancelled by shutdown: it is short, and
	// finishing it lets its offset be committed before we leave.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	items, _, err := c.applyBatch(ctx, []*kgo.Record{r})
	switch {
	case parkable(err):
		return c.park(ctx, r, err)
	case err != nil:
		return err
	}
	return c.finish(ctx, items[0])
}

// finish reports one record of a committed transaction and marks its
// offset. It runs only after the commit: counting earlier would count work
// that may still roll back.
func (c *Consumer) finish(ctx context.Context, it batchItem) error {
	r, e, res := it.rec, it.event, it.res
	if it.span != nil {
		// The record's logs carry its trace ids.
		ctx = trace.ContextWithSpan(ctx, it.span)
		defer it.span.End()
		if it.parked != "" {
			it.span.SetStatus(codes.Error, "parked: "+it.parked)
		}
	}
	if it.parked != "" {
		c.reportParked(ctx, r, it.parked, it.stored)
		return nil
	}
	c.inbox.Observe(res)
	// The record's log line is built only when it is written: at the
	// default level it is not, and a backlog is many records.
	infoOn := c.log.Enabled(ctx, slog.LevelInfo)
	info := func(msg string, attrs ...any) {
		attrs = append(append(e.LogAttrs(), slog.Int("partition", int(r.Partition)), slog.Int64("offset", r.Offset)), attrs...)
		c.log.InfoContext(ctx, msg, attrs...)
	}
	failpoint.Inject(failpoint.NotifierAfterLocalCommit)
	if c.afterLocalCommit != nil {
		if err := c.afterLocalCommit(r); err != nil {
			c.mu.Lock()
			c.crashed = true
			c.mu.Unlock()
			return fmt.Errorf("%w: %v", errCrashed, err)
		}
	}
	now := time.Now()
	for _, a := range res.Applied {
		c.metrics.ConsumeLatency.WithLabelValues(a.Type).Observe(max(now.Sub(a.Time).Seconds(), 0))
	}
	switch res.Outcome {
	case inbox.Applied, inbox.Covered:
		if infoOn {
			info("event "+string(res.Outcome), slog.Int("applied_with_held", len(res.Applied)))
		}
		c.onApplied(res.Applied)
	case inbox.Duplicate:
		// Redelivery returns the existing result: say what became of the
		// email the first delivery asked for (a read of the ledger, made
		// only for the log line).
		if infoOn {
			attrs := []any{slog.Int64("last_applied_version", res.LastVersion)}
			if state, ok := c.ledgerState(ctx, e); ok {
				attrs = append(attrs, slog.String("email_state", state))
			}
			info("duplicate event acknowledged", attrs...)
		}
	}
	c.markDone(r)
	return nil
}

func (c *Consumer) ledgerState(ctx context.Context, e inbox.Event) (string, bool) {
	row, err := notifydb.New(c.pool).EmailSendGet(ctx, OperationKey(e.ID))
	return row.State, err == nil
}

// park stores a poison record in a transaction of its own and marks its
// offset (C6).
func (c *Consumer) park(ctx context.Context, r *kgo.Record, reason error) error {
	stored, err := inbox.ParkRecord(ctx, c.pool, r, reason.Error())
	if err != nil {
		return err
	}
	c.reportParked(ctx, r, reason.Error(), stored)
	return nil
}

// reportParked logs a parked record once its parking has committed, and
// marks its offset. Its identifiers are logged only as the parked row
// stores them: the record may hold any bytes.
func (c *Consumer) reportParked(ctx context.Context, r *kgo.Record, reason string, stored bool) {
	c.log.ErrorContext(ctx, "poison record parked; its offset will be committed",
		slog.String("topic", r.Topic), slog.Int("partition", int(r.Partition)), slog.Int64("offset", r.Offset),
		slog.Bool("new", stored), slog.String("reason", reason))
	c.markDone(r)
}

func (c *Consumer) markDone(r *kgo.Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done[topicPartition{r.Topic, r.Partition}] = r
}

// commitDone commits the offsets of processed records. A failed commit is
// retried with the next batch (or on revoke); meanwhile the records stay
// processed and a redelivery would be a duplicate.
func (c *Consumer) commitDone(ctx context.Context, cl *kgo.Client) {
	c.commit(ctx, cl, func(topicPartition) bool { return true })
}

func (c *Consumer) commit(ctx context.Context, cl *kgo.Client, want func(topicPartition) bool) {
	c.mu.Lock()
	if c.crashed {
		c.mu.Unlock()
		return
	}
	var recs []*kgo.Record
	for tp, r := range c.done {
		if want(tp) {
			recs = append(recs, r)
		}
	}
	c.mu.Unlock()
	if len(recs) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := cl.CommitRecords(cctx, recs...); err != nil {
		c.log.WarnContext(ctx, "offset commit failed; will retry (records already processed are duplicates if redelivered)",
			slog.String("error", err.Error()))
		return
	}
	c.mu.Lock()
	for _, r := range recs {
		tp := topicPartition{r.Topic, r.Partition}
		if c.done[tp] == r {
			delete(c.done, tp)
		}
	}
	c.mu.Unlock()
}

// onRevoked commits what was processed on the partitions being taken away,
// so their next owner starts after it instead of redoing it.
func (c *Consumer) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	c.commit(ctx, cl, func(tp topicPartition) bool {
		for _, p := range revoked[tp.topic] {
			if p == tp.partition {
				return true
			}
		}
		return false
	})
	c.forget(cl, revoked)
}

// onLost drops the bookkeeping of partitions lost without a chance to
// commit; their next owner redelivers, and the inbox absorbs it.
func (c *Consumer) onLost(_ context.Context, cl *kgo.Client, lost map[string][]int32) {
	for _, ps := range lost {
		c.metrics.PartitionsLost.Add(float64(len(ps)))
	}
	c.forget(cl, lost)
}

// forget drops everything held for partitions this member no longer owns:
// marked offsets and kept records (their next owner reads them again from
// the committed offset). Their pause is lifted, so that if they come back
// they are fetched again.
func (c *Consumer) forget(cl *kgo.Client, parts map[string][]int32) {
	c.mu.Lock()
	gone := map[topicPartition]bool{}
	for t, ps := range parts {
		for _, p := range ps {
			tp := topicPartition{t, p}
			gone[tp] = true
			delete(c.done, tp)
			delete(c.health.lastCommit, tp)
		}
	}
	c.backlog = slices.DeleteFunc(c.backlog, func(r *kgo.Record) bool { return gone[topicPartition{r.Topic, r.Partition}] })
	c.mu.Unlock()
	cl.ResumeFetchPartitions(parts)
}
