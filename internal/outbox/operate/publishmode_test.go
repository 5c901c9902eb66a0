package operate_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
	"github.com/outboxref/orders/internal/outbox/internal/direct"
	"github.com/outboxref/orders/internal/outbox/operate"
	"github.com/outboxref/orders/internal/outbox/relay"
)

// directPath is the legacy "publish inside the transaction" call of a
// service being migrated (O7): a synchronous send of the same record the
// relay would build. mangle, when set, changes the record first, as a
// legacy encoder that drifted from the contract would.
type directPath struct {
	cl     *kgo.Client
	sent   atomic.Int64
	mangle func(*kgo.Record)
}

func (e *env) directPath(t testing.TB) *directPath {
	t.Helper()
	cl, err := kgo.NewClient(append(e.Conn, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return &directPath{cl: cl}
}

func (d *directPath) publish(ctx context.Context, e outbox.Event, createdAt time.Time) (*kgo.Record, error) {
	rec := cloudevents.Record(topic, cloudevents.Event{
		ID: e.ID, Type: e.Type, Source: "urn:outboxref:test", Time: createdAt,
		AggregateType: e.AggregateType, AggregateID: e.AggregateID, AggregateVersion: e.AggregateVersion,
		SchemaVersion: e.SchemaVersion, Traceparent: e.Traceparent, Data: e.Payload,
	})
	if d.mangle != nil {
		d.mangle(rec)
	}
	if err := d.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return nil, err
	}
	d.sent.Add(1)
	return rec, nil
}

func (d *directPath) writer(t testing.TB) *outbox.Writer {
	t.Helper()
	w, err := outbox.NewWriter(testTypes(), outbox.WithDirectPublisher(d.publish))
	require.NoError(t, err)
	return w
}

// insertWith commits ev through w and sets its ID.
func (e *env) insertWith(t testing.TB, w *outbox.Writer, ev *outbox.Event) error {
	t.Helper()
	ctx := context.Background()
	tx, err := e.DB.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	events := []outbox.Event{*ev}
	if err := w.Insert(ctx, tx, events); err != nil {
		return err
	}
	ev.ID = events[0].ID
	return tx.Commit(ctx)
}

// TestPublishModeSwitchSendsEachEventOnce is the O7 guarantee: while
// writers run concurrently and an operator keeps switching both event
// types between direct, shadow and outbox, every committed event reaches
// the topic exactly once, sent by the direct path or by the relay, never
// both and never neither. In shadow mode the relay compares and finds
// what the direct path sent.
func TestPublishModeSwitchSendsEachEventOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	dp := e.directPath(t)
	w := dp.writer(t)
	reg := prometheus.NewRegistry()
	start(t, e.relay(t, func(c *relayConfig) { c.Registerer = reg }))
	admin := e.admin()
	ctx := context.Background()

	const writers, perWriter = 4, 60
	stop := make(chan struct{})
	switched := make(chan int)
	go func() {
		modes := []operate.PublishMode{operate.ModeDirect, operate.ModeShadow, operate.ModeOutbox, operate.ModeShadow}
		n := 0
		defer func() { switched <- n }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			for j, typ := range []string{strictType, looseType} {
				if _, err := admin.SetPublishMode(ctx, ops, typ, modes[(i+j)%len(modes)]); err != nil {
					t.Errorf("switch %s: %v", typ, err)
					return
				}
				n++
			}
		}
	}()

	var (
		mu        sync.Mutex
		committed []uuid.UUID
		wg        sync.WaitGroup
	)
	for g := range writers {
		wg.Go(func() {
			for i := range perWriter {
				agg := fmt.Sprintf("agg-%d-%d", g, i/3)
				ev := event(agg, int64(i%3+1))
				if i%2 == 1 {
					loose(&ev)
				}
				if err := e.insertWith(t, w, &ev); err != nil {
					t.Errorf("insert: %v", err)
					return
				}
				mu.Lock()
				committed = append(committed, ev.ID)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(stop)
	require.Greater(t, <-switched, 4, "the modes switched while the writers ran")
	e.WaitDelivered(t, 30*time.Second)

	// Every mode was used, or the test proves less than it claims.
	byMode := map[string]int{}
	rs, err := e.DB.Pool.Query(ctx, `SELECT publish_mode, count(*) FROM outbox GROUP BY 1`)
	require.NoError(t, err)
	for rs.Next() {
		var m string
		var n int
		require.NoError(t, rs.Scan(&m, &n))
		byMode[m] = n
	}
	require.NoError(t, rs.Err())
	for _, m := range []string{"direct", "shadow", "outbox"} {
		require.Positive(t, byMode[m], "no event was written in %s mode: %v", m, byMode)
	}

	sent := ids(e.ReadAll(t))
	require.Len(t, committed, writers*perWriter)
	for _, id := range committed {
		require.Equal(t, 1, sent[id], "event %s sent %d times", id, sent[id])
	}
	require.Len(t, sent, len(committed), "nothing but the committed events was sent")
	require.EqualValues(t, byMode["direct"]+byMode["shadow"], dp.sent.Load(), "the direct path sent exactly the direct and shadow events")

	// Shadow mode compared every shadow event and found what was sent.
	var compared, matched int
	require.NoError(t, e.DB.Pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE shadow_result IS NOT NULL), count(*) FILTER (WHERE shadow_result = 'match')
		FROM outbox_direct_log WHERE publish_mode = 'shadow'`).Scan(&compared, &matched))
	require.Equal(t, byMode["shadow"], compared)
	require.Equal(t, compared, matched)
	require.EqualValues(t, matched, metricValue(t, reg, "outbox_shadow_compared_total", map[string]string{"event_type": strictType, "result": "match"})+
		metricValue(t, reg, "outbox_shadow_compared_total", map[string]string{"event_type": looseType, "result": "match"}))

	// A delivered shadow row carries the broker position the direct path got.
	var positioned int
	require.NoError(t, e.DB.Pool.QueryRow(ctx, `
		SELECT count(*) FROM outbox o JOIN outbox_direct_log l USING (event_id)
		WHERE o.publish_mode = 'shadow' AND o.broker_offset = l.broker_offset AND o.broker_partition = l.broker_partition`).Scan(&positioned))
	require.Equal(t, byMode["shadow"], positioned)
}

// TestShadowModeReportsADifference shows what shadow mode is for: the
// legacy encoder drifted (an extra field in the value, a header missing),
// the relay finds it before the cut-over, reports it, and sends nothing.
func TestShadowModeReportsADifference(t *testing.T) {
	t.Parallel()
	e := setup(t)
	dp := e.directPath(t)
	w := dp.writer(t)
	reg := prometheus.NewRegistry()
	start(t, e.relay(t, func(c *relayConfig) { c.Registerer = reg }))
	admin := e.admin()
	ctx := context.Background()
	_, err := admin.SetPublishMode(ctx, ops, strictType, operate.ModeShadow)
	require.NoError(t, err)

	// Spacing the relay's jsonb round trip normalises is no difference.
	good := event("agg-1", 1, withPayload(`{  "n":1 }`))
	require.NoError(t, e.insertWith(t, w, &good))
	dp.mangle = func(r *kgo.Record) {
		r.Value = []byte(`{"n": 2, "legacy": true}`)
		var kept []kgo.RecordHeader
		for _, h := range r.Headers {
			if h.Key != cloudevents.HeaderSchemaVersion {
				kept = append(kept, h)
			}
		}
		r.Headers = kept
	}
	bad := event("agg-1", 2)
	require.NoError(t, e.insertWith(t, w, &bad))
	e.WaitDelivered(t, 20*time.Second)

	rep, err := admin.ShadowReport(ctx, "", time.Now().Add(-time.Hour), 0)
	require.NoError(t, err)
	require.Equal(t, []operate.ShadowCount{
		{EventType: strictType, Result: "match", Count: 1},
		{EventType: strictType, Result: "mismatch", Count: 1},
	}, rep.Counts)
	require.Len(t, rep.Diffs, 1)
	require.Equal(t, bad.ID, rep.Diffs[0].EventID)
	require.Contains(t, rep.Diffs[0].Detail, "value")
	require.Contains(t, rep.Diffs[0].Detail, "header "+cloudevents.HeaderSchemaVersion+" missing from the direct send")
	require.NotContains(t, rep.Diffs[0].Detail, "key")
	require.Equal(t, 1.0, metricValue(t, reg, "outbox_shadow_compared_total", map[string]string{"event_type": strictType, "result": "mismatch"}))

	recs := e.ReadAll(t)
	require.Len(t, recs, 2, "the relay sent nothing in shadow mode")
	require.JSONEq(t, `{"n": 2, "legacy": true}`, string(recs[1].Value), "what consumers got is the direct path's record")
}

// TestShadowModeFindsAMissingSend: a row written in shadow mode by code
// that bypassed the Writer has no direct send; the comparison says so.
func TestShadowModeFindsAMissingSend(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ev := e.InsertRaw(t, event("agg-1", 1))[0]
	_, err := e.DB.Pool.Exec(context.Background(), `UPDATE outbox SET publish_mode = 'shadow' WHERE event_id = $1`, ev.ID)
	require.NoError(t, err)
	start(t, e.relay(t, nil))
	e.WaitDelivered(t, 20*time.Second)
	rep, err := e.admin().ShadowReport(context.Background(), strictType, time.Now().Add(-time.Hour), 0)
	require.NoError(t, err)
	require.Len(t, rep.Diffs, 1)
	require.Equal(t, relay.ShadowMissing, rep.Diffs[0].Result)
	require.Empty(t, e.ReadAll(t), "still nothing sent by the relay")
}

// TestDirectModeIsTheDualWrite documents what the migration removes: in
// direct mode a transaction that rolls back after the send leaves its
// event on the topic; in outbox mode the same rollback sends nothing.
func TestDirectModeIsTheDualWrite(t *testing.T) {
	t.Parallel()
	e := setup(t)
	dp := e.directPath(t)
	w := dp.writer(t)
	start(t, e.relay(t, nil))
	admin := e.admin()
	ctx := context.Background()

	rollBack := func(ev *outbox.Event) {
		tx, err := e.DB.Pool.Begin(ctx)
		require.NoError(t, err)
		events := []outbox.Event{*ev}
		require.NoError(t, w.Insert(ctx, tx, events))
		ev.ID = events[0].ID
		require.NoError(t, tx.Rollback(ctx))
	}
	_, err := admin.SetPublishMode(ctx, ops, strictType, operate.ModeDirect)
	require.NoError(t, err)
	phantom := event("agg-1", 1)
	rollBack(&phantom)

	_, err = admin.SetPublishMode(ctx, ops, strictType, operate.ModeOutbox)
	require.NoError(t, err)
	other := event("agg-2", 1)
	rollBack(&other)
	kept := event("agg-3", 1)
	require.NoError(t, e.insertWith(t, w, &kept))
	e.WaitDelivered(t, 20*time.Second)

	sent := ids(e.ReadAll(t))
	require.Equal(t, map[uuid.UUID]int{phantom.ID: 1, kept.ID: 1}, sent,
		"direct mode sent an event whose change rolled back; outbox mode sent only what committed")
}

// TestPublishModeNeedsADirectPublisher: a Writer without a legacy path
// refuses events of a type switched to direct or shadow mode, rather than
// writing events that no path would send.
func TestPublishModeNeedsADirectPublisher(t *testing.T) {
	t.Parallel()
	e := setup(t)
	admin := e.admin()
	ctx := context.Background()
	_, err := admin.SetPublishMode(ctx, ops, strictType, operate.ModeShadow)
	require.NoError(t, err)
	ev := event("agg-1", 1)
	require.ErrorIs(t, e.insertWith(t, testWriter, &ev), outbox.ErrNoDirectPublisher)
	ev = event("agg-2", 1, loose)
	require.NoError(t, e.insertWith(t, testWriter, &ev), "other types are unaffected")
	require.Equal(t, 1, e.Count(t, "true"))
}

// TestSetPublishMode covers the operator's side: validation, the listing
// and the audit trail of each switch.
func TestSetPublishMode(t *testing.T) {
	t.Parallel()
	e := setup(t)
	admin := e.admin()
	ctx := context.Background()

	modes, err := admin.PublishModes(ctx)
	require.NoError(t, err)
	require.Equal(t, []operate.ModeSetting{{EventType: looseType, Mode: operate.ModeOutbox}, {EventType: strictType, Mode: operate.ModeOutbox}},
		modes, "new installs start in outbox mode")

	_, err = admin.SetPublishMode(ctx, ops, "no.such.type", operate.ModeDirect)
	require.ErrorIs(t, err, outbox.ErrUnknownEventType)
	_, err = admin.SetPublishMode(ctx, ops, strictType, "sideways")
	require.ErrorIs(t, err, operate.ErrInvalidPublishMode)
	_, err = admin.SetPublishMode(ctx, operate.Actor{Subject: "ops"}, strictType, operate.ModeDirect)
	require.ErrorIs(t, err, operate.ErrActorRequired)

	before, err := admin.SetPublishMode(ctx, ops, strictType, operate.ModeDirect)
	require.NoError(t, err)
	require.Equal(t, operate.ModeOutbox, before)
	before, err = admin.SetPublishMode(ctx, operate.Actor{Subject: "ops2", Reason: "shadow for a week"}, strictType, operate.ModeShadow)
	require.NoError(t, err)
	require.Equal(t, operate.ModeDirect, before)
	modes, err = admin.PublishModes(ctx)
	require.NoError(t, err)
	require.Equal(t, operate.ModeShadow, modes[1].Mode)
	require.Equal(t, "ops2", modes[1].ChangedBy)
	_, err = admin.SetPublishMode(ctx, ops, strictType, operate.ModeOutbox)
	require.NoError(t, err)

	var trail []string
	rs, err := e.DB.Pool.Query(ctx, `SELECT actor || ':' || (detail->>'from') || '->' || (detail->>'to') FROM outbox_audit
		WHERE action = 'publish_mode' AND target = $1 ORDER BY id`, strictType)
	require.NoError(t, err)
	for rs.Next() {
		var s string
		require.NoError(t, rs.Scan(&s))
		trail = append(trail, s)
	}
	require.NoError(t, rs.Err())
	require.Equal(t, []string{"ops:outbox->direct", "ops2:direct->shadow", "ops:shadow->outbox"}, trail)
}

// TestModesMatchTheStoredOnes: the Writer and the relay read the modes as
// the strings package direct names; the modes an operator sets must be
// the same strings, or a switch would never reach them.
func TestModesMatchTheStoredOnes(t *testing.T) {
	t.Parallel()
	require.Equal(t, direct.ModeDirect, string(operate.ModeDirect))
	require.Equal(t, direct.ModeShadow, string(operate.ModeShadow))
	require.Equal(t, direct.ModeOutbox, string(operate.ModeOutbox))
}
