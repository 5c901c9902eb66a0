package notify

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/inbox"
)

// newSetBasedConsumer is newTestConsumer with the projector's ApplyBatch,
// as NewService wires it: the inbox takes batches set-based.
func newSetBasedConsumer(t *testing.T, e *env, proj *Projector) *Consumer {
	t.Helper()
	quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	ib, err := inbox.New(inbox.Config{Pool: e.pool, Apply: proj.Apply, ApplyBatch: proj.ApplyBatch, Covered: proj.Covered,
		Rejected: proj.Rejected, GapWindow: time.Minute, Logger: quiet, Registerer: reg})
	require.NoError(t, err)
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	return NewConsumer(ConsumerConfig{}, e.pool, ib, m, quiet, nil)
}

// TestSetBasedMatchesPerEvent: the same batches, applied with the inbox's
// set-based path and event by event, give the same outcomes and leave the
// same rows behind: markers, versions, held events, conflicts,
// projections and ledger rows. The batches mix what the set-based path
// takes (next versions of quiet aggregates, several per order) with what
// it must hand to the per-event path: redeliveries, an event_id reused for
// another aggregate at that aggregate's next version, a gap, a conflict,
// an event_id twice in one batch, an unknown type and a late email.
func TestSetBasedMatchesPerEvent(t *testing.T) {
	t.Parallel()
	a, b, c, d := newOrder(), newOrder(), newOrder(), newOrder()
	aPlaced, aPaid, aShipped := a.next(TypePlaced, nil), a.next(TypePaid, nil), a.next(TypeShipped, nil)
	bPlaced := b.next(TypePlaced, nil)
	// b's next version carries a's first event_id: a hostile or broken
	// producer. Event by event it is a duplicate (the id is known) and b's
	// later version waits for the gap.
	bReused := b.at(2, TypePaid, nil)
	bReused.id = aPlaced.id
	bShipped := b.at(3, TypeShipped, nil)
	cPlaced, cPaid, cCancelled := c.next(TypePlaced, nil), c.next(TypePaid, nil), c.next(TypeCancelled, nil)
	cRival := c.at(2, TypePaid, map[string]any{"email": "mallory@example.com"})
	dPlaced, dOther := d.next(TypePlaced, nil), d.next("order.noted", nil)
	dPaid := d.next(TypePaid, nil)
	dTwice := d.next(TypeShipped, nil)
	dLate := d.at(6, TypeCancelled, nil)
	// f already has an email for a later version than the ones arriving
	// (as after a resync of a forked history): theirs say they are late.
	f := newOrder()
	fPlaced, fPaid := f.next(TypePlaced, nil), f.next(TypePaid, nil)

	batches := [][]ev{
		{aPlaced, aPaid, bPlaced, cPlaced, cPaid, dPlaced, dOther, fPlaced, fPaid},
		// Redelivery of part of the first batch, then new work behind it.
		{aPaid, aShipped, bReused, bShipped, cPaid, cRival, cCancelled},
		// One event_id twice in a batch: processed one by one throughout.
		{dPaid, dTwice, dTwice},
		// d at v6 arrives before v5 (held), then c again: all duplicates.
		{dLate, cPlaced, cPaid, cCancelled},
	}
	owner := map[*ev]*order{}
	for _, x := range []*ev{&aPlaced, &aPaid, &aShipped} {
		owner[x] = a
	}
	for _, x := range []*ev{&bPlaced, &bReused, &bShipped} {
		owner[x] = b
	}
	for _, x := range []*ev{&cPlaced, &cPaid, &cCancelled, &cRival} {
		owner[x] = c
	}
	for _, x := range []*ev{&dPlaced, &dOther, &dPaid, &dTwice, &dLate} {
		owner[x] = d
	}
	for _, x := range []*ev{&fPlaced, &fPaid} {
		owner[x] = f
	}
	orderOf := func(x ev) *order {
		for p, o := range owner {
			if p.id == x.id && p.version == x.version {
				return o
			}
		}
		t.Fatalf("no order for event %s v%d", x.id, x.version)
		return nil
	}

	run := func(setBased bool) (outcomes [][]string, state string) {
		e := newEnv(t)
		proj := NewProjector(slog.New(slog.NewJSONHandler(io.Discard, nil)))
		var cons *Consumer
		if setBased {
			cons = newSetBasedConsumer(t, e, proj)
		} else {
			cons, _ = newTestConsumer(t, e, proj)
		}
		ctx := context.Background()
		_, err := e.pool.Exec(ctx, `INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
			aggregate_version, event_time, recipient, subject, body, state)
			VALUES ('earlier', $1, '<earlier>', $2, 'order.shipped', 9, '2026-05-01T12:00:00Z', 'a@example.com', 's', 'b', 'sent')`,
			uuid.MustParse("00000000-0000-0000-0000-000000000009"), f.id)
		require.NoError(t, err)
		for _, batch := range batches {
			var recs []*kgo.Record
			for i, x := range batch {
				x.time = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC) // the same in both runs
				r := orderOf(x).record(t, x)
				r.Topic, r.Partition, r.Offset = testTopic, 0, int64(i)
				recs = append(recs, r)
			}
			items, _, err := cons.applyBatch(ctx, recs)
			require.NoError(t, err)
			var got []string
			for _, it := range items {
				got = append(got, string(it.res.Outcome))
				require.NoError(t, cons.finish(ctx, it))
			}
			outcomes = append(outcomes, got)
		}
		return outcomes, dump(t, e)
	}
	perEvent, perEventState := run(false)
	setBased, setBasedState := run(true)
	require.Equal(t, perEvent, setBased, "the same outcomes, batch by batch")
	require.JSONEq(t, perEventState, setBasedState, "the same rows")
	// And the scenario does what it says.
	// d's unknown type is parked (it takes no version), so d's later
	// versions wait behind the gap it leaves.
	require.Equal(t, []string{"applied", "applied", "applied", "applied", "applied", "applied", "", "applied", "applied"}, perEvent[0])
	require.Contains(t, setBasedState, `"subject":"Update: Payment received for order `, "f's emails say they are late")
	require.Equal(t, []string{"duplicate", "applied", "duplicate", "held", "duplicate", "conflict", "applied"}, perEvent[1])
	require.Equal(t, []string{"held", "held", "duplicate"}, perEvent[2])
	require.Equal(t, []string{"held", "duplicate", "duplicate", "duplicate"}, perEvent[3])
}

// dump returns, as JSON, every row the notifier's batch path writes,
// without the columns that hold the time of writing.
func dump(t *testing.T, e *env) string {
	t.Helper()
	queries := map[string]string{
		"processed_event": `SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, outcome FROM processed_event ORDER BY event_id`,
		"inbox_aggregate": `SELECT aggregate_type, aggregate_id, last_version, gap_since IS NOT NULL AS gap, diverged_at IS NOT NULL AS diverged
			FROM inbox_aggregate ORDER BY aggregate_type, aggregate_id`,
		"inbox_held_event": `SELECT event_id, aggregate_version, state FROM inbox_held_event ORDER BY event_id`,
		"inbox_conflict":   `SELECT event_id, aggregate_version, existing_event_id FROM inbox_conflict ORDER BY event_id`,
		"order_projection": `SELECT order_id, email, status, currency, total_cents, refund_requested_cents, version, last_event_id
			FROM order_projection ORDER BY order_id`,
		"email_send": `SELECT operation_key, event_id, message_id, order_id, event_type, aggregate_version, event_time,
			recipient, subject, body, state, skip_reason, traceparent, tracestate FROM email_send ORDER BY operation_key`,
	}
	out := map[string]json.RawMessage{}
	for table, q := range queries {
		var rows json.RawMessage
		require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT coalesce(json_agg(t), '[]') FROM (`+q+`) t`).Scan(&rows))
		out[table] = rows
	}
	b, err := json.Marshal(out)
	require.NoError(t, err)
	return string(b)
}

// TestSetBasedFailureIsCharged: when the set-based apply fails on one event,
// the batch rolls back as a whole and the failure is charged to that
// event's record (its first attempt, for the per-record retry), as on the
// per-event path.
func TestSetBasedFailureIsCharged(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	a, b := newOrder(), newOrder()
	recs := []*kgo.Record{
		a.record(t, a.next(TypePlaced, nil)),
		{Key: []byte(a.id.String()), Value: []byte("\x00not json")}, // parked in the batch's transaction
		a.record(t, a.next(TypePaid, nil)),
		b.record(t, b.next(TypePlaced, nil)),
	}
	for i, r := range recs {
		r.Topic, r.Partition, r.Offset = testTopic, 0, int64(i)
	}
	failOn, err := DecodeRecord(recs[3])
	require.NoError(t, err)
	proj := NewProjector(slog.New(slog.NewJSONHandler(io.Discard, nil)))
	injected := errors.New("injected failure")
	proj.afterWrites = func(_ context.Context, _ pgx.Tx, x inbox.Event) error {
		if x.ID == failOn.ID {
			return injected
		}
		return nil
	}
	cons := newSetBasedConsumer(t, e, proj)
	_, failed, err := cons.applyBatch(ctx, recs)
	require.ErrorIs(t, err, injected)
	require.Equal(t, 3, failed, "the record of the event that failed, counting the parked one before it")
	for _, table := range []string{"processed_event", "order_projection", "email_send", "inbox_parked_record"} {
		require.Zero(t, e.count("SELECT count(*) FROM "+table), "%s rolled back with the batch", table)
	}
	require.Zero(t, e.count("SELECT count(*) FROM inbox_aggregate WHERE last_version > 0"), "no version moved")
}
