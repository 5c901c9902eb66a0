package notify

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/notify/smtptest"
	"github.com/outboxref/orders/internal/pgtest"
)

// TestEveryEmailingEventGetsOneOutcome is the email accounting of C4a: the
// projection follows versions, and separately, every event of an emailing
// type the notifier receives ends in exactly one ledger row with a final
// state, whatever path it took: applied in order, held then filled, held
// then covered by a resync snapshot, arriving after that snapshot, stale,
// an impostor at an owned version, or an order the orders API does not
// know. No Message-ID is sent twice.
func TestEveryEmailingEventGetsOneOutcome(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	svc := e.start(withGapWindow(300 * time.Millisecond))

	var emailing []ev // every emailing event produced, once
	produce := func(o *order, evs ...ev) {
		for _, x := range evs {
			if x.typ != TypeRefundRequested {
				emailing = append(emailing, x)
			}
		}
		e.produceEvents(o, evs...)
	}

	// In order.
	inOrder := newOrder()
	produce(inOrder, inOrder.next(TypePlaced, nil), inOrder.next(TypePaid, nil), inOrder.next(TypeShipped, nil))

	// Gap, then the missing version arrives within the window.
	filled := newOrder()
	fPlaced, fPaid, fShipped := filled.next(TypePlaced, nil), filled.next(TypePaid, nil), filled.next(TypeShipped, nil)
	produce(filled, fPlaced, fShipped)
	produce(filled, fPaid)

	// Gap, resync (the snapshot covers the held v3), then v2 arrives late.
	late := newOrder()
	lPlaced, lPaid, lShipped := late.next(TypePlaced, nil), late.next(TypePaid, nil), late.next(TypeShipped, nil)
	e.orders.set(OrderSnapshot{ID: late.id, Email: late.email, Currency: "EUR", TotalCents: 2500, Status: "shipped", Version: 3})
	produce(late, lPlaced, lShipped)

	// Snapshot only: v2 never arrives; the snapshot covers v3 and v4.
	snap := newOrder()
	sPlaced := snap.next(TypePlaced, nil)
	snap.next(TypePaid, nil) // lost for good
	sCancelled, sRefund := snap.next(TypeCancelled, nil), snap.next(TypeRefundRequested, nil)
	e.orders.set(OrderSnapshot{ID: snap.id, Email: snap.email, Currency: "EUR", TotalCents: 2500, Status: "cancelled", Version: 4})
	produce(snap, sPlaced, sCancelled, sRefund)

	// Stale: a new consumer on a long topic meets a two-day-old event.
	stale := newOrder()
	old := stale.next(TypePlaced, nil)
	old.time = time.Now().Add(-48 * time.Hour)
	produce(stale, old)

	// A conflict: a second event claims a version already owned; the
	// orders API says it never wrote it (C7).
	conflicted := newOrder()
	cPlaced := conflicted.next(TypePlaced, nil)
	rival := conflicted.at(1, TypePlaced, map[string]any{"email": "mallory@example.com"})
	e.orders.set(OrderSnapshot{ID: conflicted.id, Email: conflicted.email, Currency: "EUR", TotalCents: 2500, Status: "placed", Version: 1})
	produce(conflicted, cPlaced, rival)

	// The orders API does not know the order: the held event is parked.
	unknown := newOrder()
	uPlaced := unknown.next(TypePlaced, nil)
	unknown.next(TypePaid, nil) // lost
	uShipped := unknown.next(TypeShipped, nil)
	produce(unknown, uPlaced, uShipped)

	// Once the resyncs have run, the late v2 arrives.
	e.waitLedger(late.id, "order.placed=sent", "order.shipped=sent")
	produce(late, lPaid)

	want := map[uuid.UUID]string{}
	for _, x := range emailing {
		want[x.id] = StateSent
	}
	want[old.id] = StateSkipped + "/" + SkipStale
	want[rival.id] = StateSkipped + "/" + SkipImpostor
	want[uShipped.id] = StateSkipped + "/" + SkipNotFound

	var got map[uuid.UUID]string
	ok := assertEventually(func() bool {
		got = ledgerOutcomes(t, e)
		return fmt.Sprint(got) == fmt.Sprint(want)
	})
	require.True(t, ok, "every emailing event in, one final ledger row out:\n got %v\nwant %v", got, want)
	require.Len(t, want, len(emailing), "the test's own bookkeeping")

	for _, m := range e.smtp.Received() {
		require.Equal(t, 1, e.smtp.Count(m.MessageID), "Message-ID %s sent once", m.MessageID)
	}
	require.Len(t, e.smtp.Received(), len(emailing)-3, "everything but the three skipped was sent")

	// The state that moved: versions and snapshots, never backwards.
	require.Equal(t, int64(3), e.projection(late.id).Version)
	require.Equal(t, "shipped", e.projection(late.id).Status)
	require.Equal(t, "cancelled", e.projection(snap.id).Status)
	require.Equal(t, int64(3), e.projection(filled.id).Version)

	// The late email says so; the in-order ones do not.
	byEvent := map[uuid.UUID]string{}
	for _, o := range []*order{late, filled, inOrder} {
		for _, r := range e.ledger(o.id) {
			byEvent[r.EventID] = r.Subject
		}
	}
	require.True(t, strings.HasPrefix(byEvent[lPaid.id], "Update: "), byEvent[lPaid.id])
	require.False(t, strings.HasPrefix(byEvent[lShipped.id], "Update: "), "the covered v3 was the latest when written")
	require.False(t, strings.HasPrefix(byEvent[fShipped.id], "Update: "), "held then filled in order is not late")
	waitMetric(t, svc, 1.0, "notifier_emails_total", "result", ResultSkipped)
	waitMetric(t, svc, 1.0, "inbox_covered_total", "event_type", TypePaid)
}

// ledgerOutcomes maps each ledger row's event to "state" or "state/reason".
func ledgerOutcomes(t *testing.T, e *env) map[uuid.UUID]string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), "SELECT event_id, state, coalesce(skip_reason, '') FROM email_send")
	require.NoError(t, err)
	defer rows.Close()
	out := map[uuid.UUID]string{}
	for rows.Next() {
		var id uuid.UUID
		var state, reason string
		require.NoError(t, rows.Scan(&id, &state, &reason))
		if reason != "" {
			state += "/" + reason
		}
		out[id] = state
	}
	require.NoError(t, rows.Err())
	return out
}

// TestHostileRecordDoesNotStopThePartition: a record whose ce_id is not
// UTF-8, whose ce_type holds a NUL and whose headers hold NULs in a key and
// a value is parked, byte for byte, and the order's next event behind it
// in the same partition is applied and emailed (C6).
func TestHostileRecordDoesNotStopThePartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	svc := e.start()
	o := newOrder()
	placed, paid := o.next(TypePlaced, nil), o.next(TypePaid, nil)
	hostile := o.record(t, o.at(2, TypePaid, nil))
	for i, h := range hostile.Headers {
		switch h.Key {
		case "ce_id":
			hostile.Headers[i].Value = append([]byte{0xff, 0xfe}, h.Value[2:]...)
		case "ce_type":
			hostile.Headers[i].Value = []byte("order.paid\x00")
		}
	}
	hostile.Headers = append(hostile.Headers, kgo.RecordHeader{Key: "x-\x00", Value: []byte("a\x00b\xff")})
	e.produce(o.record(t, placed), hostile, o.record(t, paid))

	e.waitLedger(o.id, "order.placed=sent", "order.paid=sent")
	require.Equal(t, int64(2), e.projection(o.id).Version)
	var headers string
	var eventID *uuid.UUID
	require.NoError(t, e.pool.QueryRow(context.Background(),
		"SELECT headers::text, event_id FROM inbox_parked_record WHERE reason LIKE '%ce_id%'").Scan(&headers, &eventID))
	require.Nil(t, eventID, "an unreadable ce_id is not an identity")
	require.Contains(t, headers, `"key_base64"`, "the NUL key is kept in base64")
	require.Contains(t, headers, `"value_base64"`, "so are the unreadable values")
	e.eventually(func() bool { return e.committedOffset(partitionOf(t, e, o)) == 3 }, "offsets committed past the hostile record")
	waitMetric(t, svc, 1.0, "inbox_parked_records")
}

// outage makes the env's database refuse every connection, and kills the
// open ones, until the returned function is called.
func outage(t *testing.T, e *env) (end func()) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(e.dbURL)
	require.NoError(t, err)
	db := pgx.Identifier{cfg.Database}.Sanitize()
	admin, err := pgx.Connect(ctx, pgtest.ServerURL())
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "ALTER DATABASE "+db+" ALLOW_CONNECTIONS false")
	require.NoError(t, err)
	// The first round before returning: from here on, no connection works.
	_, err = admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", cfg.Database)
	require.NoError(t, err)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			_, _ = admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", cfg.Database)
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	var once sync.Once
	end = func() {
		once.Do(func() {
			close(stop)
			wg.Wait()
			// Errorf, not require: end may run on a timer's goroutine.
			if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" ALLOW_CONNECTIONS true"); err != nil {
				t.Errorf("end the outage: %v", err)
			}
			_ = admin.Close(ctx)
			e.pool.Reset() // the test's own connections were killed too
		})
	}
	t.Cleanup(end)
	return end
}

// TestDatabaseOutage is C1 under an infrastructure fault: the notifier's
// database refuses connections for longer than the rebalance timeout while
// records arrive and the group rebalances. The consumer keeps the records
// it could not process, pauses their partitions and keeps polling, so the
// member stays in the group and takes part in the rebalance; it reports
// itself degraded, and the lag, read from the broker, shows the waiting
// records and the stalled partition. When the database is back, every
// event is applied once and emailed once.
func TestDatabaseOutage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const rebalanceTimeout = 2 * time.Second
	tune := func(c *Config) {
		c.Consumer.ExtraOpts = append(c.Consumer.ExtraOpts, kgo.RebalanceTimeout(rebalanceTimeout))
		c.Consumer.LagInterval, c.Consumer.StallAfter, c.Consumer.RetryCap = 100*time.Millisecond, time.Second, 500*time.Millisecond
	}
	a := e.start(tune)
	second := func(c *Config) { tune(c); c.Consumer.InstanceID = e.group + "-2" }
	b := e.start(second)

	var before []*order
	for range 6 {
		o := newOrder()
		before = append(before, o)
		e.produceEvents(o, o.next(TypePlaced, nil))
	}
	for _, o := range before {
		e.waitLedger(o.id, "order.placed=sent")
	}

	end := outage(t, e)
	var during []*order
	for range 6 {
		o := newOrder()
		during = append(during, o)
		e.produceEvents(o, o.next(TypePlaced, nil))
	}
	e.eventually(func() bool {
		return a.metric(t, "notifier_consumer_degraded")+b.metric(t, "notifier_consumer_degraded") >= 1
	},
		"a member reports itself degraded")
	e.eventually(func() bool { return len(a.Consumer.Health().Stalled)+len(b.Consumer.Health().Stalled) > 0 },
		"the partitions that wait show as stalled")
	e.eventually(func() bool {
		return a.metric(t, "notifier_consumer_lag") >= float64(len(during)) || b.metric(t, "notifier_consumer_lag") >= float64(len(during))
	}, "the lag, read from the broker, counts the waiting records")
	// The group changes while the database is down: the second member
	// leaves, and the first must take part in the rebalance in time.
	require.NoError(t, b.shutdown(t))
	e.holds(3*rebalanceTimeout, func() (bool, string) {
		g := e.describeGroup()
		if g.State == "Empty" || g.State == "Dead" || (g.State == "Stable" && !g.hasInstance(e.group+"-1")) {
			return false, fmt.Sprintf("group %s, members %v: the first member was thrown out", g.State, g.instances)
		}
		return true, ""
	})
	e.eventually(func() bool {
		g := e.describeGroup()
		return g.State == "Stable" && g.hasInstance(e.group+"-1")
	}, "the rebalance finished while the database was down, with the first member in the group")
	end()

	for _, o := range during {
		e.waitLedger(o.id, "order.placed=sent")
	}
	e.eventually(func() bool { return a.metric(t, "notifier_consumer_degraded") == 0 }, "recovered")
	e.eventually(func() bool { return len(a.Consumer.Health().Stalled) == 0 }, "nothing stalled any more")
	require.Zero(t, a.metric(t, "notifier_partitions_lost_total"), "the member was never thrown out of the group")
	require.Equal(t, len(before)+len(during), e.count("SELECT count(*) FROM processed_event"), "nothing lost")
	require.Equal(t, len(before)+len(during), e.count("SELECT count(*) FROM email_send WHERE state = 'sent'"))
	for _, m := range e.smtp.Received() {
		require.Equal(t, 1, e.smtp.Count(m.MessageID), "nothing applied or sent twice")
	}
	require.Len(t, e.smtp.Received(), len(before)+len(during))
}

// TestResendPolicyGivesUp: under EMAIL_UNKNOWN_POLICY=resend, an email
// whose outcome stays unknown is sent at most EMAIL_MAX_ATTEMPTS times, all
// with one Message-ID, and then becomes failed for an operator, counted,
// instead of staying unknown for ever.
func TestResendPolicyGivesUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.smtp.SetBehaviour(func(int, smtptest.Message) smtptest.Action { return smtptest.Drop })
	svc := e.start(withPolicy(PolicyResend), func(c *Config) { c.Sender.MaxAttempts = 3 })
	o := newOrder()
	placed := o.next(TypePlaced, nil)
	e.produceEvents(o, placed)
	e.waitLedger(o.id, "order.placed=failed")
	row := e.ledger(o.id)[0]
	require.Equal(t, "unknown_attempts_exhausted", *row.LastErrorClass)
	require.Equal(t, int32(3), row.Attempts)
	require.Equal(t, 3, e.smtp.Count(MessageID(placed.id)))
	waitMetric(t, svc, 1.0, "notifier_emails_total", "result", ResultFailed)
	waitMetric(t, svc, 2.0, "notifier_emails_total", "result", ResultUnknown)
}

// hiccupMailer sends through the real mailer, then takes the database away
// for a moment before the sender records the result: the email left, and
// only a retried update can say so.
type hiccupMailer struct {
	Mailer
	t     *testing.T
	e     *env
	ended chan struct{}
}

func (h *hiccupMailer) Send(ctx context.Context, from, to string, msg []byte) (string, error) {
	reply, err := h.Mailer.Send(ctx, from, to, msg)
	end := outage(h.t, h.e)
	time.AfterFunc(500*time.Millisecond, func() { end(); close(h.ended) })
	// The outage kills the pool's connections every 50ms; give it one
	// round before the sender tries to record the result.
	time.Sleep(100 * time.Millisecond)
	return reply, err
}

// TestSentIsRecordedThroughADatabaseHiccup: the database fails right when
// the sender records a delivered email; the update is retried with backoff
// and the row ends 'sent', not 'unknown' (where an operator's resend would
// send a duplicate).
func TestSentIsRecordedThroughADatabaseHiccup(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hiccup := &hiccupMailer{t: t, e: e, ended: make(chan struct{})}
	e.start(func(c *Config) { hiccup.Mailer = c.Mailer; c.Mailer = hiccup })
	o := newOrder()
	placed := o.next(TypePlaced, nil)
	e.produceEvents(o, placed)
	select {
	case <-hiccup.ended:
	case <-time.After(20 * time.Second):
		t.Fatal("the email was never sent")
	}
	e.waitLedger(o.id, "order.placed=sent")
	require.Equal(t, int32(1), e.ledger(o.id)[0].Attempts)
	require.Equal(t, 1, e.smtp.Count(MessageID(placed.id)))
}

// TestStaleEmailsSkipped: a consumer group reading a topic from the start
// skips, and counts, the emails of events older than EMAIL_MAX_AGE; events
// within the age are emailed.
func TestStaleEmailsSkipped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	svc := e.start(func(c *Config) { c.Sender.MaxAge = time.Hour })
	var olds []ev
	var orders []*order
	for range 3 {
		o := newOrder()
		x := o.next(TypePlaced, nil)
		x.time = time.Now().Add(-2 * time.Hour)
		olds = append(olds, x)
		orders = append(orders, o)
		e.produceEvents(o, x)
	}
	recent := newOrder()
	e.produceEvents(recent, recent.next(TypePlaced, nil))
	e.waitLedger(recent.id, "order.placed=sent")
	for _, o := range orders {
		e.waitLedger(o.id, "order.placed=skipped")
	}
	waitMetric(t, svc, 3.0, "notifier_emails_total", "result", ResultSkipped)
	require.Len(t, e.smtp.Received(), 1)
	var ids []string
	for _, x := range olds {
		ids = append(ids, x.id.String())
	}
	sort.Strings(ids)
	require.Equal(t, 3, e.count("SELECT count(*) FROM email_send WHERE skip_reason = 'stale' AND event_id::text = ANY($1)", ids))
}

// group is what the broker says of the consumer group.
type group struct {
	State     string
	instances []string
}

func (g group) hasInstance(id string) bool { return slices.Contains(g.instances, id) }

func (e *env) describeGroup() group {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	described, err := kadm.NewClient(e.prod).DescribeGroups(ctx, e.group)
	require.NoError(e.t, err)
	d := described[e.group]
	g := group{State: d.State}
	for _, m := range d.Members {
		if m.InstanceID != nil {
			g.instances = append(g.instances, *m.InstanceID)
		}
	}
	return g
}

// holds checks cond every 50ms for d and fails at the first false: a
// property that must stay true for a while, not become true once.
func (e *env) holds(d time.Duration, cond func() (bool, string)) {
	e.t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		if ok, why := cond(); !ok {
			e.t.Fatal(why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
