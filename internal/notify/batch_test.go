package notify

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/testlog"
)

// newTestConsumer builds a Consumer on the env's database without a broker,
// for tests that drive its transactions directly. The service it returns
// only reads the consumer's and the inbox's metrics.
func newTestConsumer(t *testing.T, e *env, proj *Projector) (*Consumer, *service) {
	t.Helper()
	quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	ib, err := inbox.New(inbox.Config{Pool: e.pool, Apply: proj.Apply, Covered: proj.Covered, Rejected: proj.Rejected,
		GapWindow: time.Minute, Logger: quiet, Registerer: reg})
	require.NoError(t, err)
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	return NewConsumer(ConsumerConfig{}, e.pool, ib, m, quiet, nil), &service{reg: reg}
}

// TestBatchFailureRollsBackWholeBatch is V4 for a batch: a failure injected
// after the projection update of a record in the middle of a batch rolls
// back every record of the batch (processed_event, projection, ledger rows
// and versions, including those of the records before it), marks no offset,
// and the redelivered batch then applies each record exactly once.
func TestBatchFailureRollsBackWholeBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	a, b, c := newOrder(), newOrder(), newOrder()
	recs := []*kgo.Record{
		a.record(t, a.next(TypePlaced, nil)),
		a.record(t, a.next(TypePaid, nil)), // same aggregate: sees the placed event's writes
		b.record(t, b.next(TypePlaced, nil)),
		c.record(t, c.next(TypePlaced, nil)),
		c.record(t, c.next(TypeShipped, nil)),
	}
	for i, r := range recs {
		r.Topic, r.Partition, r.Offset = testTopic, 0, int64(i)
	}
	failOn, err := DecodeRecord(recs[2])
	require.NoError(t, err)

	proj := NewProjector(slog.New(slog.NewJSONHandler(io.Discard, nil)))
	injected := errors.New("injected failure after the projection update and the ledger write")
	var inTx atomic.Int64
	proj.afterWrites = func(ctx context.Context, tx pgx.Tx, x inbox.Event) error {
		if x.ID != failOn.ID {
			return nil
		}
		// Inside the batch's transaction, the three earlier records' writes
		// and this one's are all there...
		var markers, projections, emails int
		require.NoError(t, tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM processed_event), (SELECT count(*) FROM order_projection),
			(SELECT count(*) FROM email_send)`).Scan(&markers, &projections, &emails))
		require.Equal(t, []int{3, 2, 3}, []int{markers, projections, emails})
		inTx.Add(1)
		return injected // ...and then the business step fails.
	}
	cons, metrics := newTestConsumer(t, e, proj)

	_, failed, err := cons.applyBatch(ctx, recs)
	require.ErrorIs(t, err, injected)
	require.Equal(t, 2, failed, "the failure is charged to the record that caused it")
	require.Equal(t, int64(1), inTx.Load())
	for _, table := range []string{"processed_event", "order_projection", "email_send", "inbox_held_event", "inbox_parked_record"} {
		require.Zero(t, e.count("SELECT count(*) FROM "+table), "%s rolled back with the batch", table)
	}
	require.Zero(t, e.count("SELECT count(*) FROM inbox_aggregate WHERE last_version > 0"), "no version moved")
	require.Empty(t, cons.done, "no offset marked")
	require.Zero(t, metrics.metric(t, "notifier_consume_latency_seconds"), "nothing reported for a rolled-back batch")

	// Redelivery: the same batch, now without the failure.
	proj.afterWrites = nil
	items, failed, err := cons.applyBatch(ctx, recs)
	require.NoError(t, err)
	require.Equal(t, -1, failed)
	for i, it := range items {
		require.Equal(t, inbox.Applied, it.res.Outcome, "record %d is applied, not taken for a duplicate", i)
		require.NoError(t, cons.finish(ctx, it))
	}
	require.Equal(t, recs[len(recs)-1], cons.done[topicPartition{testTopic, 0}], "the offset marked is the batch's last")
	require.Equal(t, 5.0, metrics.metric(t, "notifier_consume_latency_seconds"), "latency observed per record once the batch committed")
	items, _, err = cons.applyBatch(ctx, recs)
	require.NoError(t, err)
	for i, it := range items {
		require.Equal(t, inbox.Duplicate, it.res.Outcome, "record %d", i)
	}
	require.Zero(t, metrics.metric(t, "inbox_duplicates_total"), "duplicates are counted after the commit, by finish")
	for _, it := range items {
		require.NoError(t, cons.finish(ctx, it))
	}
	require.Equal(t, 5.0, metrics.metric(t, "inbox_duplicates_total"))
	require.Equal(t, 5, e.count("SELECT count(*) FROM processed_event"))
	require.Equal(t, 5, e.count("SELECT count(*) FROM email_send"))
	require.Equal(t, int64(2), e.projection(a.id).Version)
	require.Equal(t, "paid", e.projection(a.id).Status)
	require.Equal(t, "shipped", e.projection(c.id).Status)
}

// TestBatchWithinOneTransaction: gaps, duplicates, conflicts and poison
// inside one batch come out as they would one transaction per record.
func TestBatchWithinOneTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	o := newOrder()
	placed, paid, shipped := o.next(TypePlaced, nil), o.next(TypePaid, nil), o.next(TypeShipped, nil)
	rival := o.at(1, TypePlaced, map[string]any{"email": "mallory@example.com"})
	garbage := &kgo.Record{Key: []byte(o.id.String()), Value: []byte("\x00not json")}
	recs := []*kgo.Record{
		o.record(t, placed), o.record(t, shipped), o.record(t, shipped), garbage,
		o.record(t, paid), o.record(t, paid), o.record(t, rival),
	}
	for i, r := range recs {
		r.Topic, r.Partition, r.Offset = testTopic, 0, int64(i)
	}
	cons, _ := newTestConsumer(t, e, NewProjector(nil))
	items, _, err := cons.applyBatch(ctx, recs)
	require.NoError(t, err)
	var got []string
	for _, it := range items {
		if it.parked != "" {
			got = append(got, "parked")
			continue
		}
		got = append(got, string(it.res.Outcome))
		require.NoError(t, cons.finish(ctx, it))
	}
	require.Equal(t, []string{"applied", "held", "duplicate", "parked", "applied", "duplicate", "conflict"}, got)
	require.Len(t, items[4].res.Applied, 2, "paid drains the shipped event held earlier in the batch")
	p := e.projection(o.id)
	require.Equal(t, "shipped", p.Status)
	require.Equal(t, int64(3), p.Version)
	require.Equal(t, "alice@example.com", p.Email)
	require.Equal(t, 3, e.count("SELECT count(*) FROM email_send WHERE state = 'pending'"))
	require.Equal(t, 1, e.count("SELECT count(*) FROM email_send WHERE event_id = $1 AND state = 'skipped' AND skip_reason = 'conflict'", rival.id),
		"the conflicting event is accounted for in the ledger, never sent")
	require.Equal(t, 1, e.count("SELECT count(*) FROM inbox_conflict WHERE event_id = $1", rival.id))
	require.Equal(t, 1, e.count("SELECT count(*) FROM inbox_parked_record WHERE \"offset\" = 3"))
	require.Zero(t, e.count("SELECT count(*) FROM inbox_held_event"))
}

// produceOnePartition writes records, in order, to partition 0, so that
// they reach the consumer in one fetch and one batch.
func (e *env) produceOnePartition(recs ...*kgo.Record) {
	e.t.Helper()
	prod, err := kgo.NewClient(kgo.SeedBrokers(e.broker), kgo.DefaultProduceTopic(testTopic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RequiredAcks(kgo.AllISRAcks()))
	require.NoError(e.t, err)
	defer prod.Close()
	for _, r := range recs {
		r.Partition = 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(e.t, prod.ProduceSync(ctx, recs...).FirstErr())
}

// TestBatchFallsBackToRecords: a record that fails every time, in the
// middle of a batch, does not block or roll back its neighbours for good.
// The batch is rolled back once, its records are applied one transaction
// each, the bad record is parked after MaxApplyAttempts attempts in all
// (the batch's counts as the first), and every neighbour is applied once.
func TestBatchFallsBackToRecords(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	orders := []*order{newOrder(), newOrder(), newOrder()}
	var recs []*kgo.Record
	var evs []ev
	for _, o := range orders {
		placed, paid := o.next(TypePlaced, nil), o.next(TypePaid, nil)
		evs = append(evs, placed, paid)
		recs = append(recs, o.record(t, placed), o.record(t, paid))
	}
	bad := evs[2] // the second order's placed event
	e.produceOnePartition(recs...)

	var mu sync.Mutex
	applies := map[uuid.UUID]int{}
	logs := &testlog.Buffer{}
	svc := e.startWith(func(s *Service) {
		s.Projector.afterWrites = func(_ context.Context, _ pgx.Tx, x inbox.Event) error {
			mu.Lock()
			defer mu.Unlock()
			applies[x.ID]++
			if x.ID == bad.id {
				return errors.New("a bug that fails this event every time")
			}
			return nil
		}
	}, withLogger(logs))

	e.waitLedger(orders[0].id, "order.placed=sent", "order.paid=sent")
	e.waitLedger(orders[2].id, "order.placed=sent", "order.paid=sent")
	e.eventually(func() bool { return e.committedOffset(0) == int64(len(recs)) }, "offsets committed past the parked record")
	require.Equal(t, 1, e.count("SELECT count(*) FROM inbox_parked_record WHERE event_id = $1 AND reason LIKE 'processing failed 5 times%'", bad.id))
	waitMetric(t, svc, 5.0, "notifier_consume_errors_total")
	require.Equal(t, 1, strings.Count(logs.String(), "batch transaction rolled back"), "one batch failed, once")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 5, applies[bad.id], "the batch's attempt and four of its own")
	require.Equal(t, 2, applies[evs[0].id], "a record before the bad one: rolled back with the batch, then applied on its own")
	require.Equal(t, 1, applies[evs[4].id], "a record after it: never reached in the batch")
	require.Equal(t, 4, e.count("SELECT count(*) FROM processed_event WHERE outcome = 'applied'"), "every neighbour applied once")
	// The second order's paid event waits for its placed event, as it
	// would without batching (a gap, resynced after the window).
	require.Equal(t, 1, e.count("SELECT count(*) FROM inbox_held_event WHERE event_id = $1", evs[3].id))
	for _, x := range []ev{evs[0], evs[1], evs[4], evs[5]} {
		require.Equal(t, 1, e.smtp.Count(MessageID(x.id)))
	}
}

// TestBatchBound: no transaction applies more than MaxBatchRecords records,
// even when a poll holds more, and the poll is still applied in order.
func TestBatchBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var most atomic.Int64
	e.startWith(func(s *Service) {
		s.Projector.afterWrites = func(ctx context.Context, tx pgx.Tx, _ inbox.Event) error {
			// Markers written by this very transaction so far.
			var n int64
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM processed_event WHERE xmin::text = pg_current_xact_id()::xid::text").Scan(&n); err != nil {
				return err
			}
			for cur := most.Load(); n > cur && !most.CompareAndSwap(cur, n); cur = most.Load() {
			}
			return nil
		}
	}, withBatchMax(2), func(c *Config) { c.Consumer.MaxPollRecords = 100 })
	o := newOrder()
	var recs []*kgo.Record
	for _, typ := range []string{TypePlaced, TypePaid, TypeShipped, TypeShipped, TypeCancelled} {
		recs = append(recs, o.record(t, o.next(typ, nil)))
	}
	e.produceOnePartition(recs...)
	e.eventually(func() bool { return e.committedOffset(0) == 5 }, "all offsets committed")
	require.Equal(t, int64(5), e.projection(o.id).Version)
	require.Equal(t, int64(2), most.Load(), "batches of two records, never more")
}

// TestCrashAfterBatchCommit: the notifier dies after a batch's local
// transaction committed and before the offset commit. Every record of the
// batch is redelivered and absorbed as a duplicate; one email each.
func TestCrashAfterBatchCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	o := newOrder()
	placed, paid, shipped := o.next(TypePlaced, nil), o.next(TypePaid, nil), o.next(TypeShipped, nil)
	e.produceOnePartition(o.record(t, placed), o.record(t, paid), o.record(t, shipped))

	var hooked atomic.Int64
	crashing := e.startWith(func(s *Service) {
		s.Consumer.afterLocalCommit = func(*kgo.Record) error {
			hooked.Add(1)
			return errors.New("kill -9")
		}
	})
	require.ErrorIs(t, crashing.shutdownAfterExit(t), errCrashed)
	require.Equal(t, int64(1), hooked.Load(), "the crash came right after the first commit")
	require.Equal(t, 3, e.count("SELECT count(*) FROM processed_event"), "the batch committed as a whole")
	require.Equal(t, int64(-1), e.committedOffset(0), "no offset was committed")

	next := e.start()
	e.eventually(func() bool { return next.metric(t, "inbox_duplicates_total") == 3 }, "the batch was redelivered and absorbed")
	e.waitLedger(o.id, "order.placed=sent", "order.paid=sent", "order.shipped=sent")
	e.eventually(func() bool { return e.committedOffset(0) == 3 }, "the offsets are committed now")
	for _, x := range []ev{placed, paid, shipped} {
		require.Equal(t, 1, e.smtp.Count(MessageID(x.id)))
	}
}
