// Package relay delivers the rows package outbox wrote to Kafka, after
// their transaction committed. A service runs it in its own process or
// beside its API; any number of relays can run at once.
//
// The relay closes the windows of delivery. The aggregates are split into
// partitions (a hash the database computes, migration 00008), and each
// partition is owned by one relay at a time, under a lease and an epoch
// that changes with every new owner; relays share the partitions evenly
// (partition.go). A relay reads the due rows of its partitions with a
// plain SELECT and sends them with no transaction open (R1); a relay that
// dies at any point leaves partitions whose leases expire, and their next
// owner sends the rows again with the same event_id (R3). It confirms a
// row, the one write each event costs, only after the broker's
// acknowledgement and only while its partition still has the epoch the
// relay read it under (R2), so a relay that stalled past its lease cannot
// overwrite what the partition's next owner sent. Broker errors and timeouts are
// unknown outcomes, retried with a backoff stored in the row (R4); events
// that can never be sent are parked (R5), and under strict ordering a
// parked event holds back its aggregate's later ones (R6). Delivery is
// therefore at least once: consumers deduplicate on event_id.
//
// Its API:
//   - Config, NewRelay, Relay: the relay and its settings; Config.Types is
//     the service's []outbox.EventType, the list its Writer was built with.
//   - Relay.Run, Relay.Nudge, Relay.Owner, Relay.BrokerState, BrokerOK.
//   - DefaultBatchSize, DefaultLease, DefaultPollInterval,
//     DefaultBackoffBase, DefaultBackoffCap, DefaultMaxMessageBytes: the
//     defaults of Config's zero values.
//   - EnsureTopic: creates the relay's topic in the background (O3).
//   - NewStatsCollector, StatsCollector, DefaultStatsRefresh: the backlog
//     metrics (O1). NewRelay registers one itself; register your own only
//     in a process that runs no relay.
//   - ErrorClass and its Class… values, ErrorClass.Parks: why a delivery
//     failed, as stored in last_error_class and labelled in metrics.
//   - ShadowMatch, ShadowMismatch, ShadowMissing: what the relay found
//     when it compared a shadow-mode row with the direct path's send (O7).
//
// Tracing (L4): the relay sends each row in a produce span that continues
// the trace stored with the row, linked to the span of the relay's batch;
// the record carries the produce span's context to the consumer.
//
// The record format is package cloudevents. In builds with the
// "failpoints" tag the relay kills itself at named crash points
// (failpoint_on.go), for the end-to-end tests.
package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
	"github.com/outboxref/orders/internal/outbox/internal/direct"
	"github.com/outboxref/orders/internal/outbox/internal/eventtypes"
	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxref/orders/internal/outbox/internal/w3c"
)

// Defaults for the zero values of Config.
const (
	DefaultBatchSize    = 100
	DefaultLease        = 30 * time.Second
	DefaultPollInterval = time.Second
	DefaultBackoffBase  = 500 * time.Millisecond
	DefaultBackoffCap   = 5 * time.Minute
	// DefaultMaxMessageBytes is franz-go's default batch limit, just under
	// the broker's default message.max.bytes (1,048,588).
	DefaultMaxMessageBytes = 1_000_012
	// maxDrainTimeout bounds how long a stopping relay waits for answers
	// to records already sent before it records the stop on their rows.
	maxDrainTimeout = 5 * time.Second
	// dbTimeout bounds each claim, confirm and release statement. They are
	// short by design; a database that cannot answer in this time is down.
	dbTimeout = 10 * time.Second
)

// Config configures a Relay. Durations left zero take the defaults above.
type Config struct {
	// Pool is the database that holds the outbox table. Register the
	// google/uuid codec on its connections (github.com/vgarvardt/pgx-google-uuid,
	// in the pool's AfterConnect, as cmd/orders does). Without it pgx
	// encodes each uuid.UUID through its driver.Valuer, as text parsed back.
	// Each read sends the ids in flight, and each confirm the ids it
	// confirms; under a backlog that took about a quarter of the CPU of
	// BenchmarkBacklogDrain's process, broker included (docs/benchmarks.md).
	Pool *pgxpool.Pool
	// Kafka holds the options that reach the cluster (seed brokers, TLS,
	// SASL, logger) as the service configures them. The relay adds its
	// producer settings after them and owns the client it builds: Run
	// creates it, flushes it and closes it.
	Kafka []kgo.Opt
	// Topic receives every event; the record key is the aggregate id, so
	// one aggregate's events share a partition.
	Topic string
	// Source is the CloudEvents source attribute (ce_source), a
	// URI-reference naming the producing service, e.g. "urn:example:billing".
	Source string
	// Types lists the event types this relay may send, with their
	// ordering policy and JSON Schemas: usually the list the service's
	// Writer was built with. Rows of other types or schema versions are
	// parked. Payloads are validated by the Writer, not again here (see
	// admit).
	Types []outbox.EventType
	// Owner names the relay in outbox_relay_partition and outbox_relay; it
	// must differ between relay instances and process restarts. When empty, the relay makes one from
	// the host name, the process id and a random suffix.
	Owner string

	// BatchSize is the most rows one read returns.
	BatchSize int
	// Lease is how long the relay's partitions stay its own without
	// renewal (it renews them every second, at least four times a lease).
	// A relay that dies keeps its partitions' rows away from others for
	// at most this long.
	Lease time.Duration
	// ProduceTimeout is the deadline of each send, measured from the start
	// of the read; it defaults to and may not exceed Lease/2 (R5a), so a
	// send never outlives the lease that protects it.
	ProduceTimeout time.Duration
	// PollInterval bounds the time between claims when idle; Nudge claims
	// at once.
	PollInterval time.Duration
	// BackoffBase and BackoffCap bound the retry delay of a failed event:
	// base·2^(attempts-1), at most the cap, with jitter (R4).
	BackoffBase time.Duration
	BackoffCap  time.Duration
	// DrainTimeout is how long Run waits, once stopped, for the broker to
	// answer records already sent, before it records the stop on their
	// rows and gives its partitions back.
	// Defaults to ProduceTimeout, at most 5s.
	DrainTimeout time.Duration
	// MaxMessageBytes is the largest record batch the producer builds; set
	// it to the topic's max.message.bytes. A single record above it is
	// parked as message_too_large.
	MaxMessageBytes int

	// Logger receives structured logs; slog.Default() when nil.
	Logger *slog.Logger
	// Registerer receives the relay's metrics and the StatsCollector; nil
	// registers nothing.
	Registerer prometheus.Registerer
	// TracerProvider receives the batch and produce spans (L4); nil means
	// the global provider, which records nothing until an OpenTelemetry
	// SDK is installed.
	TracerProvider trace.TracerProvider
}

// Relay delivers outbox rows to Kafka: it reads the due rows of the
// partitions it owns, sends them with the idempotent producer, and confirms
// each row, fenced by its partition's epoch, only after the broker
// acknowledged it.
// Any number of relays, in any number of processes, may run against one
// database.
//
// Delivery is at least once. A relay can die after the broker stored a
// record and before the row was confirmed; the successor sends the row
// again with the same event_id, and consumers deduplicate on it.
type Relay struct {
	cfg        Config
	types      *eventtypes.Set
	clientOpts []kgo.Opt
	metrics    *relayMetrics
	log        *slog.Logger
	tracer     trace.Tracer
	// produceName and produceOpts start every produce span (startProduce).
	produceName string
	produceOpts []trace.SpanStartOption
	hooks       hooks // crash points; set only by the package's tests
	own         ownership
	// floorLag is readFloorLag, changed only by the package's tests.
	floorLag time.Duration

	nudge   chan struct{}
	started atomic.Bool
	broker  atomic.Pointer[string] // BrokerState's answer
	rounds  atomic.Int64           // claims made, successful or not; for tests
	// stopAt is when Run's context was cancelled: the drain timeout of
	// every batch still to send counts from it (see produceContext).
	stopAt atomic.Pointer[time.Time]
}

// defaultOwner returns a lease owner unique to this process start:
// host, pid and a random suffix, so that a restarted process on the same
// host is a new owner.
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + uuid.NewString()[:8]
}

// NewRelay checks cfg and the event types (a JSON Schema that does not
// compile refuses to start here rather than park events later) and
// registers the metrics. The relay does nothing until Run.
func NewRelay(cfg Config) (*Relay, error) {
	if cfg.Pool == nil {
		return nil, errors.New("outbox relay: Pool is required")
	}
	if cfg.Topic == "" {
		return nil, errors.New("outbox relay: Topic is required")
	}
	if cfg.Source == "" {
		return nil, errors.New("outbox relay: Source (ce_source) is required")
	}
	types, err := eventtypes.Compile(specs(cfg.Types))
	if err != nil {
		return nil, fmt.Errorf("outbox relay: %w", err)
	}
	if cfg.Owner == "" {
		cfg.Owner = defaultOwner()
	}
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultBatchSize)
	cfg.Lease = cmp.Or(cfg.Lease, DefaultLease)
	cfg.ProduceTimeout = cmp.Or(cfg.ProduceTimeout, cfg.Lease/2)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, DefaultPollInterval)
	cfg.BackoffBase = cmp.Or(cfg.BackoffBase, DefaultBackoffBase)
	cfg.BackoffCap = cmp.Or(cfg.BackoffCap, DefaultBackoffCap)
	cfg.DrainTimeout = cmp.Or(cfg.DrainTimeout, min(cfg.ProduceTimeout, maxDrainTimeout))
	cfg.MaxMessageBytes = cmp.Or(cfg.MaxMessageBytes, DefaultMaxMessageBytes)
	switch {
	case cfg.BatchSize < 1 || cfg.BatchSize > 10_000:
		return nil, fmt.Errorf("outbox relay: BatchSize %d, want 1 to 10000", cfg.BatchSize)
	case cfg.Lease < 0 || cfg.ProduceTimeout < 0 || cfg.PollInterval < 0 || cfg.BackoffBase < 0 || cfg.DrainTimeout < 0:
		return nil, errors.New("outbox relay: durations must be positive")
	case cfg.ProduceTimeout > cfg.Lease/2:
		return nil, fmt.Errorf("outbox relay: ProduceTimeout %s exceeds half the lease (%s): a send could outlive its lease (R5a)", cfg.ProduceTimeout, cfg.Lease/2)
	case cfg.BackoffCap < cfg.BackoffBase:
		return nil, fmt.Errorf("outbox relay: BackoffCap %s is below BackoffBase %s", cfg.BackoffCap, cfg.BackoffBase)
	case cfg.MaxMessageBytes < 512 || cfg.MaxMessageBytes > 1<<30:
		return nil, fmt.Errorf("outbox relay: MaxMessageBytes %d, want 512 to 1GiB", cfg.MaxMessageBytes)
	}

	opts := append(slices.Clone(cfg.Kafka), producerOptions(cfg)...)
	if err := kgo.ValidateOpts(opts...); err != nil {
		return nil, fmt.Errorf("outbox relay: kafka client options: %w", err)
	}

	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	r := &Relay{
		cfg:        cfg,
		types:      types,
		clientOpts: opts,
		metrics:    newRelayMetrics(),
		log:        log.With("component", "outbox_relay", "lease_owner", cfg.Owner),
		tracer:     cfg.TracerProvider.Tracer(scopeName),
		nudge:      make(chan struct{}, 1),
		floorLag:   readFloorLag,
	}
	r.produceName, r.produceOpts = produceStart(cfg.Topic)
	r.metrics.initTypes(cfg.Types)
	cs := append(r.metrics.collectors(), NewStatsCollector(cfg.Pool, cfg.Types, log))
	if err := register(cfg.Registerer, cs...); err != nil {
		return nil, fmt.Errorf("outbox relay: register metrics: %w", err)
	}
	return r, nil
}

// producerOptions are the producer guarantees the relay relies on. They
// come after the caller's options so that they win.
func producerOptions(cfg Config) []kgo.Opt {
	return []kgo.Opt{
		kgo.DefaultProduceTopic(cfg.Topic),
		// R7: acks from every in-sync replica. Idempotence is franz-go's
		// default and is kept: the client's own retries never duplicate.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// R5a: franz-go waits forever by default, and refuses to give up on
		// a record whose request may have reached the broker. The relay
		// needs the opposite: a send must end before its lease does, and
		// a record that might have been stored is simply re-sent later
		// with the same event_id, which consumers deduplicate.
		// The binding deadline is the context of each batch's sends
		// (ProduceTimeout from the claim); the client's own timeouts are a
		// backstop, clamped to the minimums franz-go accepts (1s, 100ms).
		kgo.AllowIdempotentProduceCancellation(),
		kgo.RecordDeliveryTimeout(max(cfg.ProduceTimeout, time.Second)),
		kgo.ProduceRequestTimeout(max(cfg.ProduceTimeout, 100*time.Millisecond)),
		kgo.ProducerBatchMaxBytes(int32(cfg.MaxMessageBytes)),
		// No lingering. franz-go waits 10ms by default for more records
		// to fill a partition's batch, which suits a stream of single
		// sends. The relay hands over a whole claimed batch at once and
		// then waits for every answer, so a linger only adds its length
		// to every batch. Records that arrive while a request is in flight
		// still go together into the next one.
		kgo.ProducerLinger(0),
		// The key picks the partition with Kafka's murmur2 hash, so every
		// relay (and any Java producer) maps an aggregate to the same
		// partition, which is what per-aggregate order needs.
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
	}
}

// Nudge asks the relay to claim now instead of at the next poll (R8). The
// API calls it right after a commit that wrote outbox rows. It never
// blocks, and nudges that arrive while one is pending coalesce. Calling it
// on a nil Relay (relay disabled) does nothing.
func (r *Relay) Nudge() {
	if r == nil {
		return
	}
	select {
	case r.nudge <- struct{}{}:
	default:
	}
}

// Owner returns the relay's owner name (Config.Owner).
func (r *Relay) Owner() string { return r.cfg.Owner }

// Run delivers events until ctx is cancelled, then stops gracefully (R9):
// it reads nothing more, waits up to DrainTimeout for answers to records
// already sent, confirms what was acknowledged, records the stop on every
// other row with no delay, gives its partitions back so that the other
// relays take them at once, then flushes and closes its Kafka client. It
// returns nil after a graceful stop.
//
// Database and broker errors are logged and retried; they do not end Run.
// Run returns an error only if the Kafka client cannot be created or a hook
// stopped it in a test (in which case nothing is released, given back or
// flushed, as in a crash). Run may be called once.
func (r *Relay) Run(ctx context.Context) (err error) {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("outbox relay: Run called twice")
	}
	cl, err := kgo.NewClient(r.clientOpts...)
	if err != nil {
		return fmt.Errorf("outbox relay: create kafka client: %w", err)
	}
	crashed := false
	defer func() {
		if !crashed {
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.DrainTimeout)
			if ferr := cl.Flush(fctx); ferr != nil {
				r.log.WarnContext(fctx, "flush kafka producer on stop", "error", ferr)
			}
			cancel()
		}
		cl.Close()
	}()

	stopWatch := context.AfterFunc(ctx, func() {
		now := time.Now()
		r.stopAt.Store(&now)
	})
	defer stopWatch()

	r.log.InfoContext(ctx, "outbox relay started",
		"topic", r.cfg.Topic, "batch_size", r.cfg.BatchSize, "lease", r.cfg.Lease.String(),
		"produce_timeout", r.cfg.ProduceTimeout.String(), "poll_interval", r.cfg.PollInterval.String())
	wait := time.NewTimer(0) // claim at once: rows may be waiting from before a restart
	defer wait.Stop()
	for {
		select {
		case <-ctx.Done():
			// Every batch is settled (drain returns only then): the
			// partitions can go to the other relays at once (R9).
			r.giveBackAll(ctx)
			r.log.InfoContext(context.WithoutCancel(ctx), "outbox relay stopped")
			return nil
		case <-wait.C:
		case <-r.nudge:
		}
		if ctx.Err() != nil {
			continue // stop claiming; the select above returns
		}
		var err error
		if r.own.due(time.Now()) {
			err = r.maintain(ctx)
		}
		again := false
		if err == nil {
			again, err = r.drain(ctx, cl)
		}
		if isCrash(err) {
			crashed = true
			return err
		}
		next := r.cfg.PollInterval
		if err != nil {
			r.log.ErrorContext(ctx, "outbox relay cycle failed; retrying after the poll interval", "error", err)
		} else if again {
			next = 0
		}
		wait.Reset(next)
	}
}

// leased is a claimed row with what the relay needs to send it.
type leased struct {
	claim
	payload     []byte
	traceparent string
	tracestate  string
	mode        string // the publish mode the row was written in (O7)
}

// drain reads batches and delivers them, and goes on while the batches come
// back full, which means a backlog. It returns whether to read again at
// once rather than after the poll interval. It returns once nothing is in
// flight, at the latest when the partitions' upkeep (maintain) is due.
//
// Under a backlog two stages work at the same time: while one batch is
// with the broker (in a goroutine, broker below), the drain confirms the
// batch before it and reads the batch after it, in one round trip and one
// implicit transaction (claim). So the database runs one statement of the
// relay's at a time, and the broker's round trip overlaps it. At most two
// batches are in flight: the one with the broker and the one read to go
// next. Strict order holds without any further care. The read sees the
// rows it confirmed as delivered, so the strict guard lets their later
// versions through; it skips the rows with the broker, and sees them as
// pending, hence undelivered, so the guard keeps the later versions of
// their aggregates out of it. Such a read starts at the latest row in
// flight (readFrom), so those versions wait for a read from the floor:
// the first drain after the next upkeep, or the one that follows this
// drain at once, since a read that ran beside a delivery asks for another.
//
// A batch with a row the broker did not acknowledge is settled on its own,
// before the read: its release must commit before a read that could
// otherwise take the released row again.
//
// A batch keeps the produce deadline of its own read (R5a), so the time it
// waits for the batch ahead of it comes out of its sending time: a broker
// that stalls one batch also shortens the next one's, and records that run
// out of time are retried after backoff like any unanswered send. A
// healthy broker answers in milliseconds, far inside the deadline.
func (r *Relay) drain(ctx context.Context, cl *kgo.Client) (again bool, err error) {
	b := broker{r: r, cl: cl}
	var (
		next    []leased  // read, not yet sent
		nextAt  time.Time // when next's read began
		reading = true
		errs    []error
	)
	for {
		answered := b.wait()
		if answered != nil && isCrash(answered.err) {
			return false, answered.err // a simulated crash: nothing is confirmed
		}
		if len(next) > 0 {
			b.start(ctx, nextAt, next)
			next = nil
		}
		if ctx.Err() != nil {
			reading = false
		}
		if !reading {
			// No backlog, stopping, the partitions' upkeep is due, or an
			// error: deliver what is in flight and read nothing more.
			if answered == nil {
				if b.busy() {
					continue
				}
				return again, errors.Join(errs...)
			}
			if _, err := r.confirm(*answered, nil); err != nil {
				if isCrash(err) {
					b.wait()
					return false, err
				}
				errs = append(errs, err)
			}
			continue
		}
		nextAt = time.Now()
		overlapped := b.busy() || answered != nil // this read runs beside deliveries
		batch, n, err := r.prepare(ctx, answered, b.rows)
		if isCrash(err) {
			b.wait()
			return false, err // what was read is left unsent, as it would be
		}
		next = batch
		switch {
		case err != nil:
			// What is in flight is delivered all the same.
			errs, reading = append(errs, err), false
		case n < r.cfg.BatchSize || ctx.Err() != nil || r.own.due(time.Now()):
			// After a full batch, read again at once (Run heeds that
			// only when err is nil).
			again, reading = overlapped || n == r.cfg.BatchSize, false
		}
	}
}

// isCrash reports whether err comes from a hook, which stops the relay as
// a crash at that point would.
func isCrash(err error) bool {
	var he *hookError
	return errors.As(err, &he)
}

// broker is a drain's stage that has one batch with the broker, in a
// goroutine of its own, while the drain confirms the batch before it and
// reads the one after it.
type broker struct {
	r  *Relay
	cl *kgo.Client

	done chan sendResult // answers once the batch with the broker is answered; nil when none
	rows []leased        // the batch with the broker, which a read skips
}

// sendResult is a batch the broker answered, on its way to its confirm.
type sendResult struct {
	ctx      context.Context // the batch's span, which the confirm ends
	batch    []leased
	outcomes []outcome
	err      error // a hook's only
}

func (b *broker) busy() bool { return b.done != nil }

// start hands batch, read at start, to the broker. The stage must be free.
func (b *broker) start(ctx context.Context, start time.Time, batch []leased) {
	done := make(chan sendResult, 1)
	b.done, b.rows = done, batch
	go func() { done <- b.r.send(ctx, b.cl, start, batch) }()
}

// wait waits for the batch with the broker and returns what the broker
// answered for it, or nil when no batch was with the broker.
func (b *broker) wait() *sendResult {
	if b.done == nil {
		return nil
	}
	s := <-b.done
	b.done, b.rows = nil, nil
	return &s
}

// prepare confirms answered, if not nil, and reads the next batch, skipping
// sending, the batch with the broker (claim); then it settles the batch's
// shadow rows (O7). It returns the rows to send and how many rows it read.
func (r *Relay) prepare(ctx context.Context, answered *sendResult, sending []leased) (batch []leased, n int, err error) {
	batch, err = r.claim(ctx, answered, sending)
	r.rounds.Add(1)
	if err != nil || len(batch) == 0 {
		return nil, 0, err
	}
	n = len(batch)
	if err := r.afterClaim(ctx, batch); err != nil {
		return nil, n, err
	}
	batch, err = r.shadow(ctx, batch)
	return batch, n, err
}

// send hands one batch to the broker and waits for every answer. start is
// when its read began, from which its produce deadline counts.
func (r *Relay) send(ctx context.Context, cl *kgo.Client, start time.Time, batch []leased) sendResult {
	ctx, span := r.startBatch(ctx, start, len(batch))
	// The deadline counts from before the read, so it ends at least
	// Lease/2 before the lease it protects (R5a).
	pctx, done := r.produceContext(ctx, start.Add(r.cfg.ProduceTimeout))
	outcomes := r.publish(pctx, cl, batch)
	done()
	if err := r.afterProduce(ctx, outcomes); err != nil {
		span.End()
		return sendResult{err: err}
	}
	return sendResult{ctx: ctx, batch: batch, outcomes: outcomes}
}

// confirm settles one batch the broker answered and ends its span. With
// read set, the next batch is read in the confirm's round trip, and its
// rows are returned.
func (r *Relay) confirm(s sendResult, read *outboxdb.OutboxReadParams) ([]outboxdb.OutboxReadRow, error) {
	defer trace.SpanFromContext(s.ctx).End()
	// Settling must happen even when the relay is stopping: it is what
	// hands the rows over to a successor.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), dbTimeout)
	defer cancel()
	confirmed, rows, err := r.settle(sctx, fenceOf(claimsOf(s.batch)), s.outcomes, read)
	if err != nil {
		return nil, err
	}
	return rows, r.afterConfirm(s.ctx, confirmed)
}

// shadow compares and settles the claimed rows written in shadow mode,
// which the relay never sends (O7), and returns the rest, to be sent.
// Rows written in direct mode are delivered already and never claimed.
func (r *Relay) shadow(ctx context.Context, batch []leased) ([]leased, error) {
	if !slices.ContainsFunc(batch, func(l leased) bool { return l.mode == direct.ModeShadow }) {
		return batch, nil // the usual case, once a migration is over
	}
	var shadows []*leased
	var rest []leased
	for i := range batch {
		if batch[i].mode == direct.ModeShadow {
			shadows = append(shadows, &batch[i])
		} else {
			rest = append(rest, batch[i])
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	defer cancel()
	outs, err := r.compareShadow(sctx, shadows)
	if err == nil {
		err = r.settleShadow(sctx, outs)
	}
	if err != nil {
		// The shadow rows stay pending and are compared again at the
		// next read; the others are sent now.
		r.log.ErrorContext(ctx, "outbox shadow comparison failed; retrying at the next read", "error", err, "events", len(shadows))
	}
	return rest, nil
}

// produceContext returns the context of one batch's sends: detached from
// ctx so that stopping the relay does not abandon records mid-flight,
// bounded by the deadline, and cancelled with errShutdown if the relay
// stops and the broker has not answered within DrainTimeout.
func (r *Relay) produceContext(ctx context.Context, deadline time.Time) (context.Context, func()) {
	base, cancelDeadline := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	pctx, cancel := context.WithCancelCause(base)
	stop := context.AfterFunc(ctx, func() {
		// DrainTimeout counts from the stop, not from this batch's turn:
		// a batch read ahead (see drain) that is sent after the stop
		// gets what is left of it, so the sends of every batch end within
		// one DrainTimeout of the stop.
		wait := r.cfg.DrainTimeout
		if at := r.stopAt.Load(); at != nil {
			wait = time.Until(at.Add(r.cfg.DrainTimeout))
		}
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
			cancel(errShutdown)
		case <-pctx.Done():
		}
	})
	return pctx, func() {
		stop()
		cancel(nil)
		cancelDeadline()
	}
}

// publish sends every claimed row that passes admit, concurrently,
// and waits for all answers or the deadline. Rows are handed to the
// producer in claim order; franz-go keeps that order within a partition.
func (r *Relay) publish(pctx context.Context, cl *kgo.Client, batch []leased) []outcome {
	outcomes := make([]outcome, len(batch))
	recs := make([]*kgo.Record, len(batch))
	var send []int
	for i := range batch {
		outcomes[i].claim = batch[i].claim
		if class, err := admit(r.types, batch[i].EventType, batch[i].SchemaVersion); err != nil {
			outcomes[i].Err, outcomes[i].Class = err, class
			continue
		}
		recs[i], outcomes[i].span = r.record(pctx, &batch[i])
		send = append(send, i)
	}
	r.produce(pctx, cl, recs, outcomes, send)
	r.noteBroker(outcomes, send)

	// The broker's MESSAGE_TOO_LARGE is about a whole record batch, which
	// the client may have filled with several of our records: an innocent
	// small record shares the verdict of a large one. Only a record sent
	// while nothing else is in flight can be blamed, so suspects are sent
	// again one at a time, within the same deadline, before anything is
	// parked.
	if len(send) > 1 {
		for _, i := range send {
			if outcomes[i].Class == ClassMessageTooLarge {
				recs[i], outcomes[i].span = r.record(pctx, &batch[i])
				r.produce(pctx, cl, recs, outcomes, []int{i})
			}
		}
	}
	return outcomes
}

// noteBroker remembers what the last sends said about the broker, for
// BrokerState. Parked events say nothing about it.
func (r *Relay) noteBroker(outcomes []outcome, sent []int) {
	state := ""
	for _, i := range sent {
		switch o := outcomes[i]; {
		case o.Err == nil:
			if state == "" {
				state = BrokerOK
			}
		case !o.Class.Parks() && o.Class != ClassShutdown:
			state = "failing: " + string(o.Class)
		}
	}
	if state != "" {
		r.broker.Store(&state)
	}
}

// BrokerOK is BrokerState's answer when the last send was acknowledged.
const BrokerOK = "ok"

// BrokerState says how the broker answered the relay's most recent sends:
// BrokerOK, "failing: <error class>", or "unknown" before the first send.
// It is information for /readyz and logs, never a readiness condition: a
// broker outage is what the outbox absorbs (O3).
func (r *Relay) BrokerState() string {
	if r == nil {
		return "relay disabled"
	}
	if s := r.broker.Load(); s != nil {
		return *s
	}
	return "unknown"
}

// produce sends recs[i] for each i in idx and fills outcomes[i]. It returns
// when every record was answered or when pctx ends, whichever is first.
//
// franz-go checks a record's context only at certain points (before a
// request is written, after a response), so a record can outlive its
// context, e.g. while the client waits out a metadata refresh after a
// partition error. Waiting for the promise could then run past the lease
// (R5a). A record still unanswered at the deadline is therefore counted
// as an unknown outcome right away; if the client delivers it later, that
// is a duplicate with the same event_id, and its late answer is ignored.
func (r *Relay) produce(pctx context.Context, cl *kgo.Client, recs []*kgo.Record, outcomes []outcome, idx []int) {
	var (
		mu       sync.Mutex
		closed   bool
		answered = make([]bool, len(outcomes))
		left     = len(idx)
		all      = make(chan struct{})
	)
	if left == 0 {
		return
	}
	for _, i := range idx {
		outcomes[i].Err, outcomes[i].Class = nil, ""
		if pctx.Err() != nil {
			// Out of time before the send (a stop, or a batch read
			// ahead whose time went to the batches before it): the record is
			// not handed to the client, which would keep it buffered and
			// could still deliver it after its row was released. It is
			// counted below as unanswered.
			continue
		}
		r.metrics.attempts.WithLabelValues(outcomes[i].EventType).Inc()
		cl.Produce(pctx, recs[i], func(rec *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			if closed {
				return // answered after the deadline; the row was already released
			}
			answered[i] = true
			r.setOutcome(pctx, &outcomes[i], rec, err)
			endProduce(&outcomes[i])
			if left--; left == 0 {
				close(all)
			}
		})
	}
	select {
	case <-all:
	case <-pctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	closed = true
	for _, i := range idx {
		if !answered[i] {
			err := fmt.Errorf("no answer from the broker before the produce deadline: %w", context.Cause(pctx))
			outcomes[i].Err, outcomes[i].Class = err, classifyProduce(pctx, err)
			endProduce(&outcomes[i])
		}
	}
}

func (r *Relay) setOutcome(pctx context.Context, o *outcome, rec *kgo.Record, err error) {
	if err != nil {
		o.Err, o.Class = err, classifyProduce(pctx, err)
		return
	}
	o.Partition, o.Offset = rec.Partition, rec.Offset
	r.metrics.published.WithLabelValues(o.EventType).Inc()
	r.metrics.latency.WithLabelValues(o.EventType).Observe(max(time.Since(o.CreatedAt).Seconds(), 0))
}

// record builds the Kafka record of one row (R7): key = aggregate id,
// value = payload JSON, CloudEvents 1.0 binary-mode headers. It starts the
// row's produce span, which the caller ends once the broker answered, and
// the record's traceparent and tracestate are that span's context: the one
// a consumer continues (L4).
func (r *Relay) record(ctx context.Context, l *leased) (*kgo.Record, trace.Span) {
	ctx, span := r.startProduce(ctx, l)
	traceparent, tracestate := w3c.FromContext(ctx)
	return r.buildRecord(l, traceparent, tracestate), span
}

// buildRecord is the record of one row with the given trace context.
func (r *Relay) buildRecord(l *leased, traceparent, tracestate string) *kgo.Record {
	return cloudevents.Record(r.cfg.Topic, cloudevents.Event{
		ID:               l.EventID,
		Type:             l.EventType,
		Source:           r.cfg.Source,
		Time:             l.CreatedAt,
		AggregateType:    l.AggregateType,
		AggregateID:      l.AggregateID,
		AggregateVersion: l.AggregateVersion,
		SchemaVersion:    l.SchemaVersion,
		Traceparent:      traceparent,
		Tracestate:       tracestate,
		Data:             l.payload,
	})
}
