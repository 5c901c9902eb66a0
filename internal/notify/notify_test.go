package notify

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/notify/notifydb"
	"github.com/outboxref/orders/internal/notify/smtptest"
)

// TestHappyPath is the "done when" in miniature: placed, paid,
// cancelled (of a paid order) and refund_requested give exactly three
// emails, each with a Message-ID derived from its event id, and the refund
// only updates the projection.
func TestHappyPath(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	svc := e.start()
	o := newOrder()
	placed, paid := o.next(TypePlaced, nil), o.next(TypePaid, nil)
	cancelled, refund := o.next(TypeCancelled, nil), o.next(TypeRefundRequested, map[string]any{"extra_field": "tolerated"})
	e.produceEvents(o, placed, paid, cancelled, refund)

	e.waitLedger(o.id, "order.placed=sent", "order.paid=sent", "order.cancelled=sent")
	require.Len(t, e.smtp.Accepted(), 3)
	for _, x := range []ev{placed, paid, cancelled} {
		require.Equal(t, 1, e.smtp.Count(MessageID(x.id)), "one email for %s", x.typ)
	}
	p := e.projection(o.id)
	require.Equal(t, "cancelled", p.Status)
	require.Equal(t, int64(4), p.Version)
	require.Equal(t, int64(2500), *p.RefundRequestedCents)
	require.Equal(t, "alice@example.com", p.Email)
	e.eventually(func() bool { return svc.metric(t, "notifier_consume_latency_seconds") == 4 }, "latency observed per applied event")
	waitMetric(t, svc, 3.0, "notifier_emails_total", "result", ResultSent)

	// Re-producing every record of the order sends nothing new, and each
	// copy is counted as a duplicate.
	e.produceEvents(o, placed, paid, cancelled, refund)
	e.eventually(func() bool { return svc.metric(t, "inbox_duplicates_total") == 4 }, "four duplicates counted")
	// A sync point instead of reading the mailbox at once: a later event
	// of the same order (same partition, so consumed after the copies) has
	// been emailed, so any email the copies caused has been sent too.
	shipped := o.next(TypeShipped, nil)
	e.produceEvents(o, shipped)
	e.waitLedger(o.id, "order.placed=sent", "order.paid=sent", "order.cancelled=sent", "order.shipped=sent")
	require.Len(t, e.smtp.Received(), 4)
	for _, x := range []ev{placed, paid, cancelled} {
		require.Equal(t, 1, e.smtp.Count(MessageID(x.id)), "no second email for %s", x.typ)
	}
}

// TestDuplicates: the same record delivered several times, within one run
// and across a restart, sends one email (C2).
func TestDuplicates(t *testing.T) {
	t.Parallel()

	t.Run("Twice", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		svc := e.start()
		o := newOrder()
		placed := o.next(TypePlaced, nil)
		e.produceEvents(o, placed, placed)
		e.waitLedger(o.id, "order.placed=sent")
		e.eventually(func() bool { return svc.metric(t, "inbox_duplicates_total", "event_type", TypePlaced) == 1 }, "duplicate counted")
		require.Equal(t, 1, e.smtp.Count(MessageID(placed.id)))
		require.Equal(t, 1, e.count("SELECT count(*) FROM processed_event"))
	})

	t.Run("ThreeTimesAcrossRestart", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		o := newOrder()
		placed := o.next(TypePlaced, nil)

		first := e.start()
		e.produceEvents(o, placed)
		e.waitLedger(o.id, "order.placed=sent")
		require.NoError(t, first.shutdown(t))

		e.produceEvents(o, placed) // while the notifier is down
		second := e.start()
		e.produceEvents(o, placed)
		e.eventually(func() bool { return second.metric(t, "inbox_duplicates_total") == 2 }, "both copies seen as duplicates after the restart")
		// A sync point instead of a sleep: a later event's email proves
		// the sender has run since the duplicates arrived.
		paid := o.next(TypePaid, nil)
		e.produceEvents(o, paid)
		e.waitLedger(o.id, "order.placed=sent", "order.paid=sent")
		require.Equal(t, 1, e.smtp.Count(MessageID(placed.id)))
		require.Len(t, e.smtp.Received(), 2)
	})
}

// TestFailureAfterProjectionRollsBackEverything is V4: a failure injected
// after the projection update rolls back processed_event and the ledger
// row with it, and the redelivered event is then processed exactly once.
func TestFailureAfterProjectionRollsBackEverything(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	proj := NewProjector(slog.New(slog.NewJSONHandler(io.Discard, nil)))
	ib := newInbox(t, e, proj)
	injected := errors.New("injected failure after the projection update and the ledger write")
	proj.afterWrites = func(ctx context.Context, tx pgx.Tx, _ inbox.Event) error {
		// Inside the transaction all three writes are there...
		var n int
		require.NoError(t, tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM processed_event) + (SELECT count(*) FROM order_projection)
			+ (SELECT count(*) FROM email_send)`).Scan(&n))
		require.Equal(t, 3, n)
		return injected // ...and then the business step fails.
	}

	o := newOrder()
	rec := o.record(t, o.next(TypePlaced, nil))
	evt, err := DecodeRecord(rec)
	require.NoError(t, err)

	_, err = ib.Handle(ctx, evt)
	require.ErrorIs(t, err, injected)
	require.Zero(t, e.count("SELECT count(*) FROM processed_event"), "the inbox marker rolled back with the business change")
	require.Zero(t, e.count("SELECT count(*) FROM email_send"), "the email intent rolled back")
	require.Zero(t, e.count("SELECT count(*) FROM order_projection"), "the projection rolled back")
	require.Zero(t, e.count("SELECT count(*) FROM inbox_aggregate WHERE last_version > 0"))

	// Redelivery: the same record, now without the failure.
	proj.afterWrites = nil
	res, err := ib.Handle(ctx, evt)
	require.NoError(t, err)
	require.Equal(t, inbox.Applied, res.Outcome, "the redelivered event is processed, not taken for a duplicate")
	res, err = ib.Handle(ctx, evt)
	require.NoError(t, err)
	require.Equal(t, inbox.Duplicate, res.Outcome)
	require.Equal(t, 1, e.count("SELECT count(*) FROM processed_event"))
	require.Equal(t, 1, e.count("SELECT count(*) FROM email_send"))
	require.Equal(t, int64(1), e.projection(o.id).Version)
}

// TestFailureWhileConsumingIsRetried runs V4 through Kafka: the first
// attempt fails after the projection update, the consumer retries the same
// record, and one email results.
func TestFailureWhileConsumingIsRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var failures int
	svc := e.startWith(func(s *Service) {
		s.Projector.afterWrites = func(context.Context, pgx.Tx, inbox.Event) error {
			if failures < 2 {
				failures++
				return errors.New("injected")
			}
			return nil
		}
	})
	o := newOrder()
	placed := o.next(TypePlaced, nil)
	e.produceEvents(o, placed)
	e.waitLedger(o.id, "order.placed=sent")
	waitMetric(t, svc, 2.0, "notifier_consume_errors_total")
	require.Equal(t, 1, e.smtp.Count(MessageID(placed.id)))
	require.Equal(t, 1, e.count("SELECT count(*) FROM processed_event"))
}

// TestGaps covers C3: a gap is held durably, filled in order, resynced
// from the orders API after the window, and never moves state backwards.
func TestGaps(t *testing.T) {
	t.Parallel()

	t.Run("HeldThenFilledInOrder", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		svc := e.start() // the gap window is a minute: no resync here
		o := newOrder()
		placed, paid, shipped := o.next(TypePlaced, nil), o.next(TypePaid, nil), o.next(TypeShipped, nil)
		e.produceEvents(o, placed, shipped)
		e.eventually(func() bool {
			return e.count("SELECT count(*) FROM inbox_held_event WHERE event_id = $1", shipped.id) == 1
		}, "v3 held")
		e.waitLedger(o.id, "order.placed=sent")
		waitMetric(t, svc, 1.0, "inbox_gaps_total", "event_type", TypeShipped)
		require.Equal(t, int64(1), e.projection(o.id).Version)
		// The hold is durable: the offset of v3 is committed while v3 waits.
		e.eventually(func() bool { return e.committedOffset(partitionOf(t, e, o)) == 2 }, "offset of the held record committed")

		e.produceEvents(o, paid)
		e.waitLedger(o.id, "order.placed=sent", "order.paid=sent", "order.shipped=sent")
		p := e.projection(o.id)
		require.Equal(t, "shipped", p.Status)
		require.Equal(t, int64(3), p.Version)
		require.Zero(t, e.count("SELECT count(*) FROM inbox_held_event"))
		require.Equal(t, 0, e.orders.callCount())
	})

	t.Run("HeldSurvivesRestart", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		first := e.start()
		o := newOrder()
		placed, paid, shipped := o.next(TypePlaced, nil), o.next(TypePaid, nil), o.next(TypeShipped, nil)
		e.produceEvents(o, placed, shipped)
		e.eventually(func() bool { return e.count("SELECT count(*) FROM inbox_held_event") == 1 }, "v3 held")
		e.eventually(func() bool { return e.committedOffset(partitionOf(t, e, o)) == 2 }, "offsets committed")
		require.NoError(t, first.shutdown(t))

		e.start()
		e.produceEvents(o, paid)
		e.waitLedger(o.id, "order.placed=sent", "order.paid=sent", "order.shipped=sent")
	})

	t.Run("ResyncedAfterWindow", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		svc := e.start(withGapWindow(300 * time.Millisecond))
		o := newOrder()
		placed, paid := o.next(TypePlaced, nil), o.next(TypePaid, nil)
		cancelled, refund := o.next(TypeCancelled, nil), o.next(TypeRefundRequested, nil)
		// The orders API is at v2 (paid); v2 itself never reaches the topic.
		e.orders.set(OrderSnapshot{ID: o.id, Email: o.email, Currency: "EUR", TotalCents: 2500, Status: "paid", Version: 2})
		e.produceEvents(o, placed, cancelled, refund)

		e.waitLedger(o.id, "order.placed=sent", "order.cancelled=sent")
		p := e.projection(o.id)
		require.Equal(t, "cancelled", p.Status, "held v3 and v4 applied on top of the v2 snapshot")
		require.Equal(t, int64(4), p.Version)
		waitMetric(t, svc, 1.0, "inbox_resyncs_total", "result", inbox.ResyncOK)
		waitMetric(t, svc, 2.0, "inbox_gaps_total")

		// The lost v2 shows up late: state stays at v4, but the customer
		// still hears about the payment, in an email that says it is late.
		e.produceEvents(o, paid)
		e.waitLedger(o.id, "order.placed=sent", "order.cancelled=sent", "order.paid=sent")
		waitMetric(t, svc, 1.0, "inbox_covered_total", "event_type", TypePaid)
		require.Equal(t, int64(4), e.projection(o.id).Version)
		require.Equal(t, "cancelled", e.projection(o.id).Status)
		late := e.ledger(o.id)[2]
		require.True(t, strings.HasPrefix(late.Subject, "Update: Payment received"), late.Subject)
		require.Contains(t, late.Body, "This update arrives late")
	})

	t.Run("SnapshotAheadNeverRegresses", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.start(withGapWindow(300 * time.Millisecond))
		o := newOrder()
		placed, paid, shipped := o.next(TypePlaced, nil), o.next(TypePaid, nil), o.next(TypeShipped, nil)
		e.orders.set(OrderSnapshot{ID: o.id, Email: o.email, Currency: "EUR", TotalCents: 2500, Status: "shipped", Version: 3})
		e.produceEvents(o, placed, shipped)
		e.eventually(func() bool { return e.count("SELECT count(*) FROM processed_event WHERE outcome = 'superseded'") == 1 }, "v3 superseded by the v3 snapshot")
		p := e.projection(o.id)
		require.Equal(t, "shipped", p.Status)
		require.Equal(t, int64(3), p.Version)
		require.Nil(t, p.LastEventID, "state came from the snapshot")
		e.waitLedger(o.id, "order.placed=sent", "order.shipped=sent")

		e.produceEvents(o, paid, shipped) // late and repeated copies
		e.waitLedger(o.id, "order.placed=sent", "order.shipped=sent", "order.paid=sent")
		require.Equal(t, 1, e.count("SELECT count(*) FROM inbox_aggregate WHERE last_version = 3"), "still at v3")
		// (order.cancelled's schema allows previous_status placed or paid
		// only, and the notifier checks it.)
		next := o.next(TypeCancelled, map[string]any{"previous_status": "paid"})
		e.produceEvents(o, next)
		e.waitLedger(o.id, "order.placed=sent", "order.shipped=sent", "order.paid=sent", "order.cancelled=sent")
		require.Equal(t, int64(4), e.projection(o.id).Version)
		require.Equal(t, 1, e.smtp.Count(MessageID(shipped.id)), "the repeated copy sent nothing")
	})

	t.Run("NotFoundParks", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		svc := e.start(withGapWindow(300 * time.Millisecond))
		o := newOrder()
		placed := o.next(TypePlaced, nil)
		o.next(TypePaid, nil) // lost
		shipped := o.next(TypeShipped, nil)
		e.produceEvents(o, placed, shipped) // the orders API does not know the order: 404
		e.eventually(func() bool {
			return e.count("SELECT count(*) FROM inbox_held_event WHERE event_id = $1 AND state = 'parked' AND park_reason LIKE '%not found%'", shipped.id) == 1
		}, "held event parked with the 404 reason")
		waitMetric(t, svc, 1.0, "inbox_resyncs_total", "result", inbox.ResyncNotFound)
		e.eventually(func() bool { return svc.metric(t, "inbox_parked_events") == 1 }, "parked gauge")
		require.Equal(t, int64(1), e.projection(o.id).Version)
		e.waitLedger(o.id, "order.placed=sent", "order.shipped=skipped")
		require.Equal(t, SkipNotFound, *e.ledger(o.id)[1].SkipReason)
	})
}

// TestConflict: the same aggregate version under a different event_id is
// recorded and counted, and never applied.
func TestConflict(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	svc := e.start()
	o := newOrder()
	placed := o.next(TypePlaced, nil)
	rival := o.at(1, TypePlaced, map[string]any{"email": "mallory@example.com"})
	e.orders.set(OrderSnapshot{ID: o.id, Email: o.email, Currency: "EUR", TotalCents: 2500, Status: "placed", Version: 1})
	e.produceEvents(o, placed, rival)
	e.eventually(func() bool { return svc.metric(t, "inbox_conflicts_total", "event_type", TypePlaced) == 1 }, "conflict counted")
	require.Equal(t, 1, e.count("SELECT count(*) FROM inbox_conflict WHERE event_id = $1 AND existing_event_id = $2", rival.id, placed.id))
	// The orders API says which of the two it wrote: the rival is an
	// impostor, its email skipped, never sent (C7).
	e.waitLedger(o.id, "order.placed=sent", "order.placed=skipped")
	require.Equal(t, SkipImpostor, *e.ledger(o.id)[1].SkipReason)
	require.Equal(t, 1, e.count("SELECT count(*) FROM inbox_conflict WHERE event_id = $1 AND resolution = 'impostor'", rival.id))
	require.Equal(t, "alice@example.com", e.projection(o.id).Email)
	require.Zero(t, e.smtp.Count(MessageID(rival.id)))
}

// TestSMTP covers the send ledger's outcomes (C4).
func TestSMTP(t *testing.T) {
	t.Parallel()

	// syncPoint sends one more email and waits for it, proving the sender
	// has made passes since the state under test was reached.
	syncPoint := func(e *env) {
		o := newOrder()
		x := o.next(TypePlaced, nil)
		e.produceEvents(o, x)
		e.waitLedger(o.id, "order.placed=sent")
	}
	dropFirst := func(n int, _ smtptest.Message) smtptest.Action {
		if n == 1 {
			return smtptest.Drop
		}
		return smtptest.Accept
	}

	t.Run("DropAfterDataHold", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.smtp.SetBehaviour(dropFirst)
		svc := e.start(withPolicy(PolicyHold))
		o := newOrder()
		placed := o.next(TypePlaced, nil)
		e.produceEvents(o, placed)
		e.waitLedger(o.id, "order.placed=unknown")
		syncPoint(e)
		syncPoint(e)
		require.Equal(t, 1, e.smtp.Count(MessageID(placed.id)), "no automatic resend under hold")
		waitMetric(t, svc, 1.0, "notifier_emails_total", "result", ResultUnknown)
		e.eventually(func() bool { return svc.metric(t, "notifier_email_ledger_rows", "state", StateUnknown) == 1 }, "unknown visible in metrics")
		require.Equal(t, 1.0, svc.metric(t, "notifier_email_unknown_policy", "policy", "hold"))

		// The operator resolves it: one more send with the same Message-ID.
		require.NoError(t, ResolveEmail(context.Background(), e.pool, OperationKey(placed.id), ResolveResend, "ops"))
		e.waitLedger(o.id, "order.placed=sent")
		require.Equal(t, 2, e.smtp.Count(MessageID(placed.id)))
		require.Equal(t, "ops", *e.ledger(o.id)[0].ResolvedBy)
	})

	t.Run("DropAfterDataResend", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.smtp.SetBehaviour(dropFirst)
		svc := e.start(withPolicy(PolicyResend))
		o := newOrder()
		placed := o.next(TypePlaced, nil)
		e.produceEvents(o, placed)
		e.waitLedger(o.id, "order.placed=sent")
		syncPoint(e)
		got := e.smtp.Received()
		var ids []string
		for _, m := range got {
			if m.MessageID == MessageID(placed.id) {
				ids = append(ids, m.MessageID)
			}
		}
		require.Len(t, ids, 2, "exactly one resend")
		waitMetric(t, svc, 1.0, "notifier_email_resends_total")
		waitMetric(t, svc, 1.0, "notifier_emails_total", "result", ResultUnknown)
	})

	t.Run("TransientRetried", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.smtp.SetBehaviour(func(n int, _ smtptest.Message) smtptest.Action {
			if n <= 2 {
				return smtptest.TempFail
			}
			return smtptest.Accept
		})
		svc := e.start()
		o := newOrder()
		placed := o.next(TypePlaced, nil)
		e.produceEvents(o, placed)
		e.waitLedger(o.id, "order.placed=sent")
		require.Equal(t, int32(3), e.ledger(o.id)[0].Attempts)
		waitMetric(t, svc, 2.0, "notifier_emails_total", "result", ResultTransient)
		require.Len(t, e.smtp.Accepted(), 1)
	})

	t.Run("PermanentParked", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.smtp.SetBehaviour(func(n int, _ smtptest.Message) smtptest.Action {
			if n == 1 {
				return smtptest.PermFail
			}
			return smtptest.Accept
		})
		svc := e.start()
		o := newOrder()
		placed := o.next(TypePlaced, nil)
		e.produceEvents(o, placed)
		e.waitLedger(o.id, "order.placed=failed")
		syncPoint(e)
		row := e.ledger(o.id)[0]
		require.Equal(t, "permanent", *row.LastErrorClass)
		require.Contains(t, *row.LastError, "554")
		require.Equal(t, 1, e.smtp.Count(MessageID(placed.id)), "a 5xx is not retried")
		waitMetric(t, svc, 1.0, "notifier_emails_total", "result", ResultFailed)
	})

	t.Run("StuckSendingBecomesUnknown", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		o := newOrder()
		placed := o.next(TypePlaced, nil)
		// A sender claimed the row and died: it is 'sending' since long ago.
		evt, err := DecodeRecord(o.record(t, placed))
		require.NoError(t, err)
		_, err = newInbox(t, e, NewProjector(nil)).Handle(context.Background(), evt)
		require.NoError(t, err)
		_, err = e.pool.Exec(context.Background(), `UPDATE email_send SET state = 'sending', attempts = 1,
			claim_token = gen_random_uuid(), sending_since = now() - interval '1 hour'`)
		require.NoError(t, err)

		svc := e.start(withPolicy(PolicyHold))
		e.waitLedger(o.id, "order.placed=unknown")
		require.Equal(t, "sending_timeout", *e.ledger(o.id)[0].LastErrorClass)
		syncPoint(e)
		require.Zero(t, e.smtp.Count(MessageID(placed.id)), "a crashed send is never silently resent")
		waitMetric(t, svc, 1.0, "notifier_emails_total", "result", ResultUnknown)
	})
}

// TestCrashBetweenLocalCommitAndOffsetCommit: the notifier dies after its
// local transaction committed and before the offset commit. The record is
// redelivered to the next instance, absorbed as a duplicate, one email.
func TestCrashBetweenLocalCommitAndOffsetCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	o := newOrder()
	placed := o.next(TypePlaced, nil)

	crashing := e.startWith(func(s *Service) {
		s.Consumer.afterLocalCommit = func(*kgo.Record) error { return errors.New("kill -9") }
	})
	e.produceEvents(o, placed)
	err := crashing.shutdownAfterExit(t)
	require.ErrorIs(t, err, errCrashed)
	require.Equal(t, 1, e.count("SELECT count(*) FROM processed_event"), "the local transaction committed")
	require.Equal(t, int64(-1), e.committedOffset(partitionOf(t, e, o)), "the offset was not committed")

	next := e.start()
	e.eventually(func() bool { return next.metric(t, "inbox_duplicates_total") == 1 }, "the record was redelivered and absorbed")
	e.waitLedger(o.id, "order.placed=sent")
	e.eventually(func() bool { return e.committedOffset(partitionOf(t, e, o)) == 1 }, "the offset is committed now")
	require.Equal(t, 1, e.smtp.Count(MessageID(placed.id)))
	require.Equal(t, 1, e.count("SELECT count(*) FROM email_send"))
}

// shutdownAfterExit waits for an instance that stops by itself.
func (s *service) shutdownAfterExit(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.done:
		close(s.done)
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("notifier did not exit")
		return nil
	}
}

// TestPoison is C6: a garbage record is parked with its raw content, its
// offset is committed, and the next record on the partition is processed.
func TestPoison(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	svc := e.start()
	o := newOrder()
	garbage := &kgo.Record{Key: []byte(o.id.String()), Value: []byte("\x00not json"),
		Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte("not-a-uuid")}}}
	future := o.at(1, TypePlaced, nil)
	future.schemaVersion = "2"
	placed := o.at(1, TypePlaced, nil)
	e.produce(garbage, o.record(t, future), o.record(t, placed))

	e.waitLedger(o.id, "order.placed=sent")
	require.Equal(t, 1, e.smtp.Count(MessageID(placed.id)))
	require.Equal(t, 1, e.count("SELECT count(*) FROM inbox_parked_record WHERE record_value = $1 AND event_id IS NULL AND reason LIKE '%ce_specversion%'", garbage.Value))
	require.Equal(t, 1, e.count("SELECT count(*) FROM inbox_parked_record WHERE event_id = $1 AND reason LIKE '%schema version 2%'", future.id))
	e.eventually(func() bool { return svc.metric(t, "inbox_parked_records") == 2 }, "parked gauge")
	e.eventually(func() bool { return e.committedOffset(partitionOf(t, e, o)) == 3 }, "offsets past the poison committed")
}

// TestDecodeRecord checks the record contract without a broker.
func TestDecodeRecord(t *testing.T) {
	t.Parallel()
	o := newOrder()
	good := func() *kgo.Record { return o.record(t, o.at(1, TypePlaced, nil)) }
	set := func(r *kgo.Record, k, v string) *kgo.Record {
		for i := range r.Headers {
			if r.Headers[i].Key == k {
				r.Headers[i].Value = []byte(v)
			}
		}
		return r
	}
	e, err := DecodeRecord(good())
	require.NoError(t, err)
	require.Equal(t, o.id.String(), e.AggregateID)
	require.Equal(t, int64(1), e.AggregateVersion)

	// C7: what the orders service could not have written never reaches the
	// inbox. An unknown type takes no version; a record from another
	// source, or with a payload its schema refuses, is parked.
	paid := func(payload string) *kgo.Record {
		r := o.record(t, o.at(2, TypePaid, nil))
		r.Value = []byte(payload)
		return r
	}
	validPaid := `{"order_id":"` + o.id.String() + `","email":"a@example.com","currency":"EUR","total_cents":1,"paid_at":"2026-01-02T03:04:05Z"}`
	_, err = DecodeRecord(paid(validPaid))
	require.NoError(t, err)
	for name, r := range map[string]*kgo.Record{
		"UnknownType":   set(good(), "ce_type", "order.refunded_v9"),
		"OtherSource":   set(good(), "ce_source", "urn:evil"),
		"InvalidUTF8":   paid(strings.Replace(validPaid, `"EUR"`, "\"E\xffR\"", 1)),
		"DuplicateKey":  paid(strings.Replace(validPaid, `"email":"a@example.com"`, `"email":"a@example.com","email":"evil@evil.example"`, 1)),
		"SchemaRefuses": paid(strings.Replace(validPaid, `"EUR"`, `"eur"`, 1)),
		"TwoValues":     paid(validPaid + validPaid),
		"MissingPaidAt": paid(strings.Replace(validPaid, `,"paid_at":"2026-01-02T03:04:05Z"`, "", 1)),
	} {
		_, err := DecodeRecord(r)
		require.True(t, parkable(err), "%s: %v", name, err)
	}
	other, err := NewDecoder("urn:other")
	require.NoError(t, err)
	_, err = other.Decode(good())
	require.ErrorContains(t, err, `ce_source "urn:outboxref:orders" is not the orders service's "urn:other"`)

	for name, r := range map[string]*kgo.Record{
		"BadVersion":      set(good(), "ce_aggregateversion", "x"),
		"ZeroVersion":     set(good(), "ce_aggregateversion", "0"),
		"SchemaV2":        set(good(), "ce_schemaversion", "2"),
		"OtherAggregate":  set(good(), "ce_aggregatetype", "invoice"),
		"SubjectMismatch": set(good(), "ce_subject", uuid.NewString()),
		"BadTime":         set(good(), "ce_time", "yesterday"),
		"ContentType":     set(good(), "content-type", "text/plain"),
		"NotJSON":         func() *kgo.Record { r := good(); r.Value = []byte("{"); return r }(),
		"NoEmail": func() *kgo.Record {
			r := good()
			r.Value = []byte(`{"order_id":"` + o.id.String() + `","currency":"EUR","total_cents":1}`)
			return r
		}(),
		"WrongOrderID": func() *kgo.Record {
			r := good()
			r.Value = []byte(strings.Replace(string(r.Value), o.id.String(), uuid.NewString(), 1))
			return r
		}(),
	} {
		_, err := DecodeRecord(r)
		require.True(t, parkable(err), "%s: %v", name, err)
	}
}

// TestProject pins the business rules: which events email whom.
func TestProject(t *testing.T) {
	t.Parallel()
	id := uuid.New()
	prev := func(status string) *notifydb.OrderProjection {
		return &notifydb.OrderProjection{Email: "a@example.com", Status: status, Version: 1}
	}
	for _, tc := range []struct {
		typ, payload string
		prev         *notifydb.OrderProjection
		wantStatus   string
		wantEmail    bool
	}{
		{TypePlaced, `{"email":"a@example.com","currency":"EUR","total_cents":5,"items":[]}`, nil, "placed", true},
		{TypePaid, `{"email":"a@example.com"}`, prev("placed"), "paid", true},
		{TypeCancelled, `{"email":"a@example.com","previous_status":"paid"}`, prev("paid"), "cancelled", true},
		{TypeShipped, `{"email":"a@example.com"}`, prev("paid"), "shipped", true},
		{TypeRefundRequested, `{"currency":"EUR","amount_cents":5}`, prev("cancelled"), "cancelled", false},
	} {
		e := inbox.Event{ID: uuid.New(), Type: tc.typ, AggregateID: id.String(), AggregateVersion: 2,
			Payload: []byte(strings.Replace(tc.payload, "{", `{"order_id":"`+id.String()+`",`, 1))}
		p, err := parsePayload(e)
		require.NoError(t, err, tc.typ)
		next, mail := project(tc.prev, id, e, p)
		require.Equal(t, tc.wantStatus, next.Status, tc.typ)
		require.Equal(t, tc.wantEmail, mail != nil, tc.typ)
		if mail != nil {
			require.Equal(t, "a@example.com", mail.Recipient)
		}
	}
}

// TestDeterministicFailureParked: a record whose processing keeps failing
// for a reason retrying cannot fix is parked after MaxApplyAttempts, so its
// partition moves on (C6); the version it leaves missing is then a gap,
// resolved from the orders API like any other.
func TestDeterministicFailureParked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	o := newOrder()
	placed, paid := o.next(TypePlaced, nil), o.next(TypePaid, nil)
	svc := e.startWith(func(s *Service) {
		s.Projector.afterWrites = func(_ context.Context, _ pgx.Tx, x inbox.Event) error {
			if x.ID == placed.id {
				return errors.New("a bug that fails this event every time")
			}
			return nil
		}
	}, withGapWindow(300*time.Millisecond))
	e.orders.set(OrderSnapshot{ID: o.id, Email: o.email, Currency: "EUR", TotalCents: 2500, Status: "placed", Version: 1})
	e.produceEvents(o, placed, paid)

	e.waitLedger(o.id, "order.paid=sent")
	require.Equal(t, 1, e.count("SELECT count(*) FROM inbox_parked_record WHERE event_id = $1 AND reason LIKE 'processing failed 5 times%'", placed.id))
	waitMetric(t, svc, 5.0, "notifier_consume_errors_total")
	waitMetric(t, svc, 1.0, "inbox_resyncs_total", "result", inbox.ResyncOK)
	require.Equal(t, "paid", e.projection(o.id).Status)
}

// TestCleanupLedger: sent rows past the retention go, in batches; rows an
// operator still has to look at stay.
func TestCleanupLedger(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ib := newInbox(t, e, NewProjector(nil))
	for range 5 {
		o := newOrder()
		evt, err := DecodeRecord(o.record(t, o.next(TypePlaced, nil)))
		require.NoError(t, err)
		_, err = ib.Handle(ctx, evt)
		require.NoError(t, err)
	}
	_, err := e.pool.Exec(ctx, `UPDATE email_send SET state = 'sent', created_at = now() - interval '2 hours'`)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE email_send SET state = 'unknown' WHERE operation_key = (SELECT min(operation_key) FROM email_send)`)
	require.NoError(t, err)
	n, err := CleanupLedger(ctx, e.pool, time.Hour, 2, time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, int64(4), n)
	require.Equal(t, 1, e.count("SELECT count(*) FROM email_send WHERE state = 'unknown'"))

	_, err = CleanupLedger(ctx, e.pool, time.Hour, 0, 0)
	require.Error(t, err, "a zero batch size would loop forever")
	_, err = ib.Cleanup(ctx, time.Hour, 0, 0)
	require.Error(t, err)
}

// gateMailer accepts every message, but holds the first send until the
// test releases it: a slow SMTP relay under the test's control.
type gateMailer struct {
	started chan struct{}
	release chan struct{}
	mu      sync.Mutex
	sent    []string
}

func (g *gateMailer) Send(_ context.Context, _, to string, _ []byte) (string, error) {
	g.mu.Lock()
	g.sent = append(g.sent, to)
	first := len(g.sent) == 1
	g.mu.Unlock()
	if first {
		close(g.started)
		select { // a test that never releases fails here, not at the suite's timeout
		case <-g.release:
		case <-time.After(30 * time.Second):
			return "", errors.New("gateMailer: never released")
		}
	}
	return "250 ok", nil
}

func (g *gateMailer) calls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.sent)
}

// TestSenderClaimsOneRowPerSend: the sender claims a row only when its send
// begins. While one send hangs, the other due rows stay pending and
// unclaimed, so a sender killed at that moment leaves one row for the
// stuck-send sweep to call unknown, not a whole batch (C4).
func TestSenderClaimsOneRowPerSend(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ib := newInbox(t, e, NewProjector(nil))
	for range 3 {
		o := newOrder()
		evt, err := DecodeRecord(o.record(t, o.next(TypePlaced, nil)))
		require.NoError(t, err)
		_, err = ib.Handle(ctx, evt)
		require.NoError(t, err)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	mailer := &gateMailer{started: make(chan struct{}), release: make(chan struct{})}
	s := NewSender(e.pool, mailer, SenderConfig{From: "orders@shop.test", PollInterval: time.Hour, SendingTimeout: time.Minute},
		m, slog.New(slog.DiscardHandler))

	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := s.RunOnce(ctx)
		done <- result{n, err}
	}()
	select {
	case <-mailer.started:
	case <-time.After(20 * time.Second):
		t.Fatal("the sender did not start sending")
	}
	require.Equal(t, 1, e.count("SELECT count(*) FROM email_send WHERE state = 'sending'"), "only the send in progress is claimed")
	require.Equal(t, 2, e.count("SELECT count(*) FROM email_send WHERE state = 'pending' AND attempts = 0 AND claim_token IS NULL"))
	close(mailer.release)
	var r result
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the sender did not finish")
	}
	require.NoError(t, r.err)
	require.Equal(t, 3, r.n)
	require.Equal(t, 3, mailer.calls())
	require.Equal(t, 3, e.count("SELECT count(*) FROM email_send WHERE state = 'sent'"))
}
