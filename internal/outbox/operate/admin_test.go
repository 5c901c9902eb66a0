package operate_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/operate"
	"github.com/outboxref/orders/internal/outbox/relay"
)

var ops = operate.Actor{Subject: "ops", Reason: "incident 42"}

func (e *env) admin() *operate.Admin { return operate.NewAdmin(e.DB.Pool, testWriter) }

// TestRepairAndResume is O4 end to end: an event the relay parks (written
// by newer code, with a schema version this relay does not know) blocks its
// aggregate; an operator sees it in the parked list, repairs its schema
// version and payload, and resumes it. It is delivered with the same
// event_id and version, and the aggregate's later events follow in order.
// Every write is audited with the actor, the reason and hashes.
func TestRepairAndResume(t *testing.T) {
	t.Parallel()
	e := setup(t)
	bad := e.InsertRaw(t, event("agg-1", 1, func(ev *outbox.Event) { ev.SchemaVersion = 2; ev.Payload = json.RawMessage(`{"count": 1}`) }))[0]
	later := e.Insert(t, event("agg-1", 2), event("agg-1", 3))
	other := e.Insert(t, event("agg-2", 1))[0]
	start(t, e.relay(t, nil))
	require.Eventually(t, func() bool { return e.Row(t, other.ID).State == "delivered" && e.Row(t, bad.ID).State == "parked" },
		20*time.Second, 10*time.Millisecond)
	admin := e.admin()
	ctx := context.Background()

	parked, err := admin.Parked(ctx, operate.ParkedFilter{EventType: strictType})
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, bad.ID, parked[0].EventID)
	require.Equal(t, string(relay.ClassUnknownSchemaVersion), parked[0].ErrorClass)
	require.Equal(t, "pending", e.Row(t, later[0].ID).State, "the parked head blocks its aggregate")

	// A repair that still breaks the contract is refused, nothing written.
	_, err = admin.Repair(ctx, bad.ID, operate.Repair{SchemaVersion: 1}, ops)
	require.ErrorIs(t, err, outbox.ErrInvalidEvent, "v1 requires n")
	_, err = admin.Repair(ctx, bad.ID, operate.Repair{SchemaVersion: 1, Payload: json.RawMessage(`{"n": 1}`)}, operate.Actor{Subject: "ops"})
	require.ErrorIs(t, err, operate.ErrActorRequired, "a reason is required")
	_, err = admin.Repair(ctx, other.ID, operate.Repair{SchemaVersion: 1}, ops)
	require.ErrorIs(t, err, operate.ErrNotParked)

	d, err := admin.Repair(ctx, bad.ID, operate.Repair{SchemaVersion: 1, Payload: json.RawMessage(`{"n": 1}`)}, ops)
	require.NoError(t, err)
	require.Equal(t, "parked", d.State, "repaired, still parked until resumed")
	require.JSONEq(t, `{"n": 1}`, string(d.Payload))

	resumed, err := admin.Resume(ctx, []uuid.UUID{bad.ID}, "", operate.Actor{Subject: "ops2", Reason: "repaired in incident 42"})
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{bad.ID}, resumed)
	e.WaitDelivered(t, 20*time.Second)

	var versions []int64
	for _, r := range e.ReadAll(t) {
		if r.Key == "agg-1" {
			versions = append(versions, r.Version)
			if r.Version == 1 {
				require.Equal(t, bad.ID, r.EventID, "the same event_id, never a new event")
			}
		}
	}
	require.Equal(t, []int64{1, 2, 3}, versions, "the aggregate's later events follow in order")

	d, err = admin.Event(ctx, bad.ID)
	require.NoError(t, err)
	require.Equal(t, "delivered", d.State)
	require.Len(t, d.Audit, 2)
	require.Equal(t, []string{"repair", "resume"}, []string{d.Audit[0].Action, d.Audit[1].Action})
	require.Equal(t, []string{"ops", "ops2"}, []string{d.Audit[0].Actor, d.Audit[1].Actor})
	require.Equal(t, "incident 42", d.Audit[0].Reason)
	require.NotEqual(t, d.Audit[0].BeforeSHA256, d.Audit[0].AfterSHA256)
	require.Len(t, d.Audit[0].BeforeSHA256, 64)

	_, err = admin.Resume(ctx, []uuid.UUID{bad.ID}, "", ops)
	require.ErrorIs(t, err, operate.ErrNotParked, "resuming twice changes nothing")
}

func TestStats(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.Insert(t, event("a", 1), event("b", 1, loose))
	stats, err := e.admin().Stats(context.Background())
	require.NoError(t, err)
	require.Len(t, stats, 2)
	for _, s := range stats {
		require.Equal(t, "pending", s.State)
		require.Equal(t, int64(1), s.Count)
		require.False(t, s.Oldest.IsZero())
	}
}

// TestReplay is O5: a plan publishes nothing; a plan of more events than
// the threshold, and every time-range plan, runs only after a second
// admin's approval; the run publishes the original records again (same
// event_id, key, headers), and records each publication in the event's
// history; archived events are listed as skipped.
func TestReplay(t *testing.T) {
	t.Parallel()
	e := setup(t)
	evs := e.Insert(t, event("a", 1), event("a", 2), event("b", 1))
	start(t, e.relay(t, nil))
	e.WaitDelivered(t, 20*time.Second)
	before := len(e.ReadAll(t))
	admin := e.admin()
	ctx := context.Background()
	policy := operate.ReplayPolicy{ApprovalThreshold: 2, Consumers: []operate.Consumer{
		{Name: "mailer", EventTypes: []string{strictType}, InboxRetention: time.Millisecond, SideEffects: map[string]string{strictType: "email"}},
		{Name: "audit", EventTypes: []string{looseType}, InboxRetention: time.Hour},
	}}

	small, err := admin.PlanReplay(ctx, operate.ReplaySelector{IDs: []uuid.UUID{evs[0].ID, evs[1].ID}}, policy, ops)
	require.NoError(t, err)
	require.False(t, small.NeedsApproval)
	require.Equal(t, map[string]int{strictType: 2}, small.Counts)
	require.Len(t, small.Consumers, 1, "only the mailer reads the strict type")
	require.Equal(t, "mailer", small.Consumers[0].Name)
	require.Equal(t, map[string]string{strictType: "email"}, small.Consumers[0].SideEffects)
	require.Len(t, small.Consumers[0].TooOld, 2, "a warning per event older than the mailer's inbox retention")
	require.Len(t, e.ReadAll(t), before, "a plan publishes nothing")

	rangePlan, err := admin.PlanReplay(ctx, operate.ReplaySelector{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Minute)}, policy, ops)
	require.NoError(t, err)
	require.True(t, rangePlan.NeedsApproval, "every time-range plan needs a second admin")
	require.Equal(t, 3, rangePlan.Events)

	cl, err := kgo.NewClient(append(e.Conn, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))...)
	require.NoError(t, err)
	defer cl.Close()
	target := operate.ReplayTarget{Client: cl, Topic: topic, Source: "urn:outboxref:test", Rate: 1000}
	_, err = admin.RunReplay(ctx, rangePlan.ID, target, policy, ops)
	require.ErrorIs(t, err, operate.ErrNeedsApproval)
	_, err = admin.ApproveReplay(ctx, rangePlan.ID, policy, ops)
	require.ErrorIs(t, err, operate.ErrSameApprover)
	approved, err := admin.ApproveReplay(ctx, rangePlan.ID, policy, operate.Actor{Subject: "ops2", Reason: "checked the plan"})
	require.NoError(t, err)
	require.Equal(t, "approved", approved.Status)

	done, err := admin.RunReplay(ctx, rangePlan.ID, target, policy, operate.Actor{Subject: "ops2", Reason: "incident 42"})
	require.NoError(t, err)
	require.Equal(t, "done", done.Status)
	require.Equal(t, 3, done.Published)
	_, err = admin.RunReplay(ctx, rangePlan.ID, target, policy, ops)
	require.ErrorIs(t, err, operate.ErrPlanState, "a plan runs once")

	after := e.ReadAll(t)
	require.Len(t, after, before+3)
	copies := map[uuid.UUID][]record{}
	for _, r := range after {
		copies[r.EventID] = append(copies[r.EventID], r)
	}
	for _, ev := range evs {
		require.Len(t, copies[ev.ID], 2, "the original and its replay")
		orig, again := copies[ev.ID][0], copies[ev.ID][1]
		require.Equal(t, orig.Key, again.Key)
		require.Equal(t, orig.Value, again.Value)
		require.Equal(t, orig.Headers, again.Headers, "the same headers, event_id and version included")
	}
	d, err := admin.Event(ctx, evs[0].ID)
	require.NoError(t, err)
	require.Len(t, d.Replays, 2, "both plans are in the event's history")
	published := 0
	for _, r := range d.Replays {
		if r.State == "published" {
			published++
			require.NotNil(t, r.Offset)
		}
	}
	require.Equal(t, 1, published)

	// Once cleaned up, an event can no longer be replayed: it is skipped.
	_, err = e.DB.Pool.Exec(ctx, "UPDATE outbox SET delivered_at = now() - interval '2 days' WHERE event_id = $1", evs[2].ID)
	require.NoError(t, err)
	_, err = admin.Cleanup(ctx, operate.Cleanup{Retention: 24 * time.Hour, BatchSize: 10})
	require.NoError(t, err)
	p, err := admin.PlanReplay(ctx, operate.ReplaySelector{IDs: []uuid.UUID{evs[1].ID, evs[2].ID}}, policy, ops)
	require.NoError(t, err)
	require.Equal(t, 1, p.Events)
	require.Len(t, p.Skipped, 1)
	require.Equal(t, evs[2].ID, p.Skipped[0].EventID)
	require.Contains(t, p.Skipped[0].Reason, "archived")
}

// TestCleanup is O6: a backlog of delivered rows past the retention is
// archived and deleted in batches while writes and the relay keep going;
// pending and parked rows are never touched, however old, and recent
// delivered rows stay.
func TestCleanup(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var old []outbox.Event
	for i := range 120 {
		old = append(old, e.Insert(t, event(fmt.Sprintf("old-%d", i), 1))...)
	}
	start(t, e.relay(t, nil))
	e.WaitDelivered(t, 30*time.Second)
	_, err := e.DB.Pool.Exec(ctx, "UPDATE outbox SET delivered_at = now() - interval '10 days', created_at = now() - interval '10 days'")
	require.NoError(t, err)
	parked := e.InsertRaw(t, event("parked", 1, func(ev *outbox.Event) { ev.SchemaVersion = 9 }))[0]
	require.Eventually(t, func() bool { return e.Row(t, parked.ID).State == "parked" }, 20*time.Second, 10*time.Millisecond)
	_, err = e.DB.Pool.Exec(ctx, "UPDATE outbox SET created_at = now() - interval '10 days', next_attempt_at = now() - interval '10 days' WHERE event_id = $1", parked.ID)
	require.NoError(t, err)

	// Writes and deliveries go on while the cleanup runs.
	var writing sync.WaitGroup
	var wrote atomic.Int64
	stop := make(chan struct{})
	writing.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			e.Insert(t, event(fmt.Sprintf("new-%d", i), 1))
			wrote.Add(1)
		}
	})
	admin := e.admin()
	n, err := admin.Cleanup(ctx, operate.Cleanup{Retention: 24 * time.Hour, BatchSize: 25, Pause: time.Millisecond})
	close(stop)
	writing.Wait()
	require.NoError(t, err)
	require.Equal(t, int64(len(old)), n, "every old delivered row, in batches of 25")
	e.WaitDelivered(t, 30*time.Second)

	require.Zero(t, e.Count(t, "aggregate_id LIKE 'old-%'"), "the old delivered rows are gone")
	require.Equal(t, int(wrote.Load()), e.Count(t, "aggregate_id LIKE 'new-%' AND state = 'delivered'"), "recent rows stay")
	require.Equal(t, 1, e.Count(t, "state = 'parked'"), "a parked row is never cleaned, however old")
	var archived int
	require.NoError(t, e.DB.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox_archive WHERE broker_offset IS NOT NULL").Scan(&archived))
	require.Equal(t, len(old), archived, "each deleted row left its identity and broker position")

	d, err := admin.Event(ctx, old[0].ID)
	require.NoError(t, err)
	require.True(t, d.Archived)
	require.Nil(t, d.Payload, "the archive keeps no payload")
	require.NotNil(t, d.BrokerOffset)

	_, err = admin.Cleanup(ctx, operate.Cleanup{Retention: time.Hour})
	require.Error(t, err, "a zero batch would never finish")
}

// TestCleanupOneRunnerAtATime: while a run holds the lock, another
// process's run returns at once.
func TestCleanupOneRunnerAtATime(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	conn, err := e.DB.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SELECT pg_advisory_lock(7215402116)")
	require.NoError(t, err)
	e.Insert(t, event("a", 1))
	_, err = e.DB.Pool.Exec(ctx, "UPDATE outbox SET state = 'delivered', delivered_at = now() - interval '2 days'")
	require.NoError(t, err)
	n, err := e.admin().Cleanup(ctx, operate.Cleanup{Retention: time.Hour, BatchSize: 10})
	require.NoError(t, err)
	require.Zero(t, n)
	_, err = conn.Exec(ctx, "SELECT pg_advisory_unlock(7215402116)")
	require.NoError(t, err)
	n, err = e.admin().Cleanup(ctx, operate.Cleanup{Retention: time.Hour, BatchSize: 10})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

// TestRepairCheck: a repair passes the writer's checks and then the
// service's own (WithRepairCheck); a refusal by either is ErrRepairRefused
// (400 over HTTP, naming the problem) and writes and audits nothing. A
// repair that passes both is stored.
func TestRepairCheck(t *testing.T) {
	t.Parallel()
	e := setup(t)
	bad := e.InsertRaw(t, event("agg-1", 1, func(ev *outbox.Event) { ev.SchemaVersion = 2 }))[0]
	start(t, e.relay(t, nil))
	require.Eventually(t, func() bool { return e.Row(t, bad.ID).State == "parked" }, 20*time.Second, 10*time.Millisecond)
	ctx := context.Background()
	var checked []outbox.Event
	admin := operate.NewAdmin(e.DB.Pool, testWriter, operate.WithRepairCheck(func(ev outbox.Event) error {
		checked = append(checked, ev)
		var p struct{ N int }
		if err := json.Unmarshal(ev.Payload, &p); err != nil || p.N < 0 {
			return errors.New("payload n must not be negative")
		}
		return nil
	}))
	h := admin.Handler(operate.AdminHandlerConfig{Actor: func(*http.Request) string { return "ops" }, Log: testLogger()})
	repair := func(body string) (int, string) {
		res := httptest.NewRecorder()
		h.ServeHTTP(res, httptest.NewRequest(http.MethodPost, "/events/"+bad.ID.String()+"/repair", strings.NewReader(body)))
		var problem struct{ Detail string }
		_ = json.Unmarshal(res.Body.Bytes(), &problem)
		return res.Code, problem.Detail
	}
	unchanged := func() {
		t.Helper()
		d, err := admin.Event(ctx, bad.ID)
		require.NoError(t, err)
		require.Equal(t, 2, d.SchemaVersion)
		require.JSONEq(t, `{"n": 1}`, string(d.Payload))
		require.Empty(t, d.Audit, "a refused repair is not audited")
	}

	_, err := admin.Repair(ctx, bad.ID, operate.Repair{SchemaVersion: 1, Payload: json.RawMessage(`{"n": -1}`)}, ops)
	require.ErrorIs(t, err, operate.ErrRepairRefused)
	require.ErrorContains(t, err, "payload n must not be negative")
	require.Len(t, checked, 1)
	require.Equal(t, bad.ID, checked[0].ID, "the check sees the event as it would be stored")
	require.Equal(t, "agg-1", checked[0].AggregateID)
	require.Equal(t, 1, checked[0].SchemaVersion)
	unchanged()

	status, detail := repair(`{"schema_version": 1, "payload": {"n": -1}, "reason": "fix"}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, detail, "repair refused: payload n must not be negative")
	status, detail = repair(`{"schema_version": 1, "payload": {"n": "one"}, "reason": "fix"}`)
	require.Equal(t, http.StatusBadRequest, status, "the writer's refusal too")
	require.Contains(t, detail, "fails JSON Schema")
	unchanged()

	status, detail = repair(`{"schema_version": 1, "payload": {"n": 3}, "reason": "fix"}`)
	require.Equal(t, http.StatusOK, status, detail)
	d, err := admin.Event(ctx, bad.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"n": 3}`, string(d.Payload))
	require.Len(t, d.Audit, 1)
}
