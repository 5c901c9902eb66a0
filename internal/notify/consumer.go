package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

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
	// a new deployment next to a long-retention topic may prefer latest.
	StartAtLatest bool
	// MaxApplyAttempts bounds the attempts for a record whose processing
	// fails with an error that retrying cannot fix (a constraint violation,
	// a bug): it is then parked so it does not block its partition
	// forever (C6). Infrastructure errors (connection, timeout, deadlock)
	// are retried without limit, since parking would lose good events.
	MaxApplyAttempts int
	// ExtraOpts are added to the client (TLS, SASL, test tuning).
	ExtraOpts []kgo.Opt
}

// DefaultMaxBatchRecords is the default bound on the records applied in one
// local transaction: enough to spread the cost of a commit (a WAL flush)
// over many records, small enough that the transaction stays well under a
// second and its row locks short.
const DefaultMaxBatchRecords = 200

// Consumer reads order events from Kafka and runs them through the inbox
// in local transactions (C1, C2). The records of one poll are applied in
// batches, each in one transaction; a batch that fails is rolled back as a
// whole and its records are applied again one transaction each, so a
// single bad record never holds back its neighbours. Offsets are committed
// only for records whose transaction committed, so a crash at any point
// redelivers, and the inbox absorbs, whatever was not committed.
type Consumer struct {
	cfg     ConsumerConfig
	pool    *pgxpool.Pool
	inbox   *inbox.Inbox
	proj    *Projector
	metrics *Metrics
	log     *slog.Logger
	// onApplied is called after a transaction that applied events
	// committed; the notifier nudges its sender there.
	onApplied func()

	mu sync.Mutex
	// done holds, per partition, the last record whose local transaction
	// committed but whose offset is not committed yet.
	done    map[topicPartition]*kgo.Record
	crashed bool

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

// errCrashed is returned by Run when a test hook simulated a crash.
var errCrashed = errors.New("consumer crashed (simulated)")

// NewConsumer returns a Consumer. onApplied may be nil.
func NewConsumer(cfg ConsumerConfig, pool *pgxpool.Pool, ib *inbox.Inbox, proj *Projector, m *Metrics, log *slog.Logger, onApplied func()) *Consumer {
	if cfg.MaxBatchRecords <= 0 {
		cfg.MaxBatchRecords = DefaultMaxBatchRecords
	}
	if cfg.MaxPollRecords <= 0 {
		// At least 100, so that small batches do not mean one offset
		// commit (a broker round trip) per batch.
		cfg.MaxPollRecords = max(cfg.MaxBatchRecords, 100)
	}
	if cfg.MaxApplyAttempts <= 0 {
		cfg.MaxApplyAttempts = 5
	}
	if log == nil {
		log = slog.Default()
	}
	if onApplied == nil {
		onApplied = func() {}
	}
	return &Consumer{cfg: cfg, pool: pool, inbox: ib, proj: proj, metrics: m, log: log, onApplied: onApplied,
		done: map[topicPartition]*kgo.Record{}}
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
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
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

	for {
		fetches := cl.PollRecords(ctx, c.cfg.MaxPollRecords)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fetches.EachError(func(topic string, p int32, err error) {
			c.log.WarnContext(ctx, "kafka fetch error", slog.String("topic", topic), slog.Int("partition", int(p)), slog.String("error", err.Error()))
		})
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if n := len(p.Records); n > 0 {
				lag := p.HighWatermark - p.Records[n-1].Offset - 1
				c.metrics.ConsumerLag.WithLabelValues(p.Topic, strconv.Itoa(int(p.Partition))).Set(float64(max(lag, 0)))
			}
		})
		// The poll's records are applied in batches of MaxBatchRecords, a
		// batch possibly spanning partitions. EachRecord yields each
		// partition's records in offset order and a batch keeps it: the
		// inbox needs it for the versions of one aggregate (one key, one
		// partition), and the offset marked for a partition is then always
		// its last processed record. A shutdown stops between batches; the
		// rest of the poll is redelivered to the next owner.
		var recs []*kgo.Record
		fetches.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
		var stopErr error
		for len(recs) > 0 && stopErr == nil && ctx.Err() == nil {
			n := min(len(recs), c.cfg.MaxBatchRecords)
			stopErr = c.processBatch(ctx, recs[:n])
			recs = recs[n:]
		}
		if errors.Is(stopErr, errCrashed) {
			return stopErr
		}
		c.commitDone(ctx, cl)
		cl.AllowRebalance()
		if stopErr != nil {
			break // stopping while a record was being retried
		}
	}
	c.commitDone(ctx, cl)
	return nil
}

// batchItem is one record of a committed batch and what became of it.
type batchItem struct {
	rec   *kgo.Record
	event inbox.Event
	res   inbox.Result
	// parked is why a record that could not be decoded was parked in the
	// batch's transaction; nil for a record that went through the inbox.
	parked *inbox.Record
	stored bool // the parking stored a new row (not a redelivered one)
}

// processBatch applies recs in one local transaction and then, record by
// record and only after the commit, reports each one (metrics, logs) and
// marks its offset. If the transaction fails, nothing of it is kept (V4
// holds for the whole batch) and the records are applied again one
// transaction each, with the per-record retry and parking rules. That
// fallback is what keeps one poison record from rolling back its
// neighbours forever; it costs one slow batch, not a blocked partition.
func (c *Consumer) processBatch(ctx context.Context, recs []*kgo.Record) error {
	if len(recs) == 1 {
		return c.processWithRetry(ctx, recs[0], nil)
	}
	// Like a single record's, the batch's transaction is not cancelled by
	// shutdown: it is short, and finishing it lets its offsets be
	// committed. A batch that outlives the deadline fails with a transient
	// error and falls back to records, each with a deadline of its own.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	items, failed, err := c.applyBatch(tctx, recs)
	if err != nil {
		return c.fallback(ctx, recs, failed, err)
	}
	for _, it := range items {
		if err := c.finish(tctx, it); err != nil {
			return err
		}
	}
	return nil
}

// fallback applies the records of a failed batch one transaction each.
// The record that failed the batch has spent its first attempt there, so a
// record that keeps failing is still parked after MaxApplyAttempts
// attempts in all. A failure that belongs to no record (begin, commit) is
// counted once; a poison record is parked by its own attempt, as always.
func (c *Consumer) fallback(ctx context.Context, recs []*kgo.Record, failed int, cause error) error {
	attrs := []any{slog.Int("batch_size", len(recs)), slog.String("error", cause.Error())}
	if failed >= 0 {
		r := recs[failed]
		attrs = append(attrs, slog.String("topic", r.Topic), slog.Int("partition", int(r.Partition)), slog.Int64("offset", r.Offset))
	} else {
		c.metrics.ConsumeErrors.Inc()
	}
	c.log.WarnContext(ctx, "batch transaction rolled back; applying its records one transaction each", attrs...)
	for i, r := range recs {
		var prior error
		if i == failed && !parkable(cause) {
			prior = cause
		}
		if err := c.processWithRetry(ctx, r, prior); err != nil {
			return err
		}
	}
	return nil
}

// applyBatch runs recs, in order, through the inbox in one local
// transaction. Each Process call sees the writes of the earlier ones, so
// two events of one aggregate in a batch behave as in two transactions.
// Nothing is reported here: the caller does that once the transaction has
// committed. On failure everything is rolled back, and failed is the index
// of the record being processed, or -1 when the failure was no record's
// (begin, commit).
func (c *Consumer) applyBatch(ctx context.Context, recs []*kgo.Record) (items []batchItem, failed int, err error) {
	failed = -1
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		for i, r := range recs {
			e, derr := DecodeRecord(r)
			if errors.Is(derr, errPoison) {
				rec := parkedRecord(r, derr)
				stored, err := inbox.ParkRecord(ctx, tx, rec)
				if err != nil {
					failed = i
					return err
				}
				items = append(items, batchItem{rec: r, event: e, parked: &rec, stored: stored})
				continue
			}
			res, err := c.inbox.Process(ctx, tx, e, c.proj.Apply)
			if err != nil {
				failed = i
				return err
			}
			items = append(items, batchItem{rec: r, event: e, res: res})
		}
		return nil
	})
	if err != nil {
		return nil, failed, err
	}
	return items, -1, nil
}

// parkable reports whether err means the record can never be processed:
// it is parked at once rather than retried.
func parkable(err error) bool {
	return errors.Is(err, errPoison) || errors.Is(err, inbox.ErrInvalidEvent)
}

// processWithRetry handles one record in a transaction of its own until it
// is processed or parked. An infrastructure failure (the database is down,
// a deadlock) is retried with backoff and blocks the partition, because
// skipping the record would lose it; any other failure is retried
// MaxApplyAttempts times and then parked. A non-nil prior is the outcome of
// the record's first attempt, made in a batch that failed on it. It
// returns early only when the consumer is stopping.
func (c *Consumer) processWithRetry(ctx context.Context, r *kgo.Record, prior error) error {
	delay := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := prior
		if attempt > 1 || prior == nil {
			err = c.process(ctx, r)
		}
		if err == nil {
			return nil
		}
		if errors.Is(err, errCrashed) {
			return err
		}
		c.metrics.ConsumeErrors.Inc()
		c.log.ErrorContext(ctx, "processing record failed; retrying", slog.String("topic", r.Topic), slog.Int("partition", int(r.Partition)),
			slog.Int64("offset", r.Offset), slog.Int("attempt", attempt), slog.String("error", err.Error()))
		if attempt >= c.cfg.MaxApplyAttempts && !transient(err) {
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			e, _ := DecodeRecord(r)
			perr := c.park(pctx, r, e, fmt.Errorf("processing failed %d times: %w", attempt, err))
			cancel()
			if perr == nil {
				return nil
			}
			err = perr
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, 10*time.Second)
	}
}

// process handles one record: decode, then one local transaction through
// the inbox, then the offset is marked for commit.
func (c *Consumer) process(ctx context.Context, r *kgo.Record) error {
	// The local transaction is not cancelled by shutdown: it is short, and
	// finishing it lets its offset be committed before we leave.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()

	items, _, err := c.applyBatch(ctx, []*kgo.Record{r})
	switch {
	case parkable(err):
		e, _ := DecodeRecord(r)
		return c.park(ctx, r, e, err)
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
	if it.parked != nil {
		c.reportParked(ctx, r, e, *it.parked, it.stored)
		return nil
	}
	c.inbox.Observe(res)
	log := c.log.With(append(e.LogAttrs(), slog.Int("partition", int(r.Partition)), slog.Int64("offset", r.Offset))...)
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
	case inbox.Applied:
		log.InfoContext(ctx, "event applied", slog.Int("applied_with_held", len(res.Applied)))
		c.onApplied()
	case inbox.Duplicate:
		// Redelivery returns the existing result: say what became of the
		// email the first delivery asked for.
		attrs := []any{slog.Int64("last_applied_version", res.LastVersion)}
		if state, ok := c.ledgerState(ctx, e); ok {
			attrs = append(attrs, slog.String("email_state", state))
		}
		log.InfoContext(ctx, "duplicate event acknowledged", attrs...)
	}
	c.markDone(r)
	return nil
}

// transient reports whether err comes from the infrastructure rather than
// from the record: such errors are retried for as long as it takes.
func transient(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "40", "53", "57", "58": // connection, rollback (deadlock, serialization), resources, shutdown, system
			return true
		}
		return pgErr.Code == "55P03" // lock_not_available
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) || pgconn.SafeToRetry(err)
}

func (c *Consumer) ledgerState(ctx context.Context, e inbox.Event) (string, bool) {
	row, err := notifydb.New(c.pool).EmailSendGet(ctx, OperationKey(e.ID))
	return row.State, err == nil
}

// park stores a poison record in a transaction of its own and marks its
// offset (C6).
func (c *Consumer) park(ctx context.Context, r *kgo.Record, e inbox.Event, reason error) error {
	rec := parkedRecord(r, reason)
	stored, err := inbox.ParkRecord(ctx, c.pool, rec)
	if err != nil {
		return err
	}
	c.reportParked(ctx, r, e, rec, stored)
	return nil
}

func parkedRecord(r *kgo.Record, reason error) inbox.Record {
	rec := inbox.Record{Source: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Reason: reason.Error()}
	for _, h := range r.Headers {
		rec.Headers = append(rec.Headers, inbox.NewHeader(h.Key, h.Value))
		if h.Key == hdrID {
			rec.EventID = string(h.Value)
		}
	}
	return rec
}

// reportParked counts and logs a parked record once its parking has
// committed, and marks its offset.
func (c *Consumer) reportParked(ctx context.Context, r *kgo.Record, e inbox.Event, rec inbox.Record, stored bool) {
	if stored {
		c.metrics.ParkedRecords.Inc()
	}
	c.log.ErrorContext(ctx, "poison record parked; its offset will be committed",
		slog.String("topic", r.Topic), slog.Int("partition", int(r.Partition)), slog.Int64("offset", r.Offset),
		slog.String("event_id", rec.EventID), slog.String("aggregate_id", e.AggregateID),
		slog.Int64("aggregate_version", e.AggregateVersion), slog.String("reason", rec.Reason))
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
	c.forget(revoked)
}

// onLost drops the bookkeeping of partitions lost without a chance to
// commit; their next owner redelivers, and the inbox absorbs it.
func (c *Consumer) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.forget(lost)
}

func (c *Consumer) forget(parts map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, ps := range parts {
		for _, p := range ps {
			delete(c.done, topicPartition{t, p})
		}
	}
}
