package operate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/operate"
)

var ops2 = operate.Actor{Subject: "ops2", Reason: "checked the plan"}

// replayWorld is a test's delivered events, a producer for replays and
// the topic's record count before any replay.
type replayWorld struct {
	*env
	admin  *operate.Admin
	events []outbox.Event
	target operate.ReplayTarget
	before int
}

// replaySetup delivers n strict events of distinct aggregates.
func replaySetup(t *testing.T, n int) *replayWorld {
	t.Helper()
	e := setup(t)
	var evs []outbox.Event
	for i := range n {
		evs = append(evs, event(fmt.Sprintf("agg-%d", i), 1))
	}
	evs = e.Insert(t, evs...)
	r := start(t, e.relay(t, nil))
	e.WaitDelivered(t, 20*time.Second)
	require.NoError(t, r.Stop(t))
	cl, err := kgo.NewClient(append(e.Conn, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return &replayWorld{env: e, admin: e.admin(), events: evs, before: len(e.ReadAll(t)),
		target: operate.ReplayTarget{Client: cl, Topic: topic, Source: "urn:outboxref:test", Rate: 1000}}
}

func (w *replayWorld) ids(evs ...outbox.Event) []uuid.UUID {
	if len(evs) == 0 {
		evs = w.events
	}
	out := make([]uuid.UUID, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

func (w *replayWorld) published(t *testing.T, plan uuid.UUID) int {
	t.Helper()
	n, err := w.countPublished(plan)
	require.NoError(t, err)
	return n
}

// countPublished is published for goroutines other than the test's,
// which must not call t.FailNow.
func (w *replayWorld) countPublished(plan uuid.UUID) (int, error) {
	var n int
	err := w.DB.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM outbox_replay_item WHERE plan_id = $1 AND state = 'published'", plan).Scan(&n)
	return n, err
}

// whenPublished calls f, in the background, once n events of plan are
// published (or the test's database is gone).
func (w *replayWorld) whenPublished(plan uuid.UUID, n int, f func()) {
	go func() {
		for {
			got, err := w.countPublished(plan)
			if err != nil || got >= n {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		f()
	}()
}

func (w *replayWorld) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := w.DB.Pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// interruptAfter runs plan slowly and ends the run's context once n
// events are published, as a stopping process does. It checks the plan is
// left interrupted, with every finished send recorded, and returns how
// many events were published.
func (w *replayWorld) interruptAfter(t *testing.T, plan uuid.UUID, n int, policy operate.ReplayPolicy) int {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	w.whenPublished(plan, n, stop)
	slow := w.target
	slow.Rate = 20
	ended, err := w.admin.RunReplay(ctx, plan, slow, policy, ops)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, "interrupted", ended.Status, "a stop leaves the plan resumable: %s", ended.RunError)
	require.NotContains(t, ended.RunError, "context canceled")
	require.Empty(t, ended.RunOwner, "no runner holds it")
	require.GreaterOrEqual(t, ended.Published, n)
	require.Equal(t, ended.Published, w.published(t, plan), "every send finished was recorded")
	return ended.Published
}

// requireReplayedOnce checks the topic holds each event's original and
// exactly one copy per plan.
func (w *replayWorld) requireReplayedOnce(t *testing.T, plans int) {
	t.Helper()
	copies := ids(w.ReadAll(t))
	require.Len(t, copies, len(w.events))
	for _, ev := range w.events {
		require.Equal(t, 1+plans, copies[ev.ID], "event %s: its original and one copy per plan", ev.ID)
	}
}

// TestReplayInterrupted: a run whose context ends mid-plan (the process
// is stopping) records what it published and leaves the plan interrupted,
// not failed and not running; ResumeReplays, as a relay process runs it
// at start, continues it from the first unpublished event to done. Each
// event is published exactly once by the plan.
func TestReplayInterrupted(t *testing.T) {
	t.Parallel()
	w := replaySetup(t, 30)
	policy := operate.ReplayPolicy{ApprovalThreshold: 100, RunLease: 3 * time.Second}
	plan, err := w.admin.PlanReplay(context.Background(), operate.ReplaySelector{IDs: w.ids()}, policy, ops)
	require.NoError(t, err)

	published := w.interruptAfter(t, plan.ID, 5, policy)
	require.Less(t, published, 30)

	resumer, stopResumer := context.WithCancel(context.Background())
	defer stopResumer()
	go w.admin.ResumeReplays(resumer, policy, func(context.Context) (operate.ReplayTarget, error) { return w.target, nil }, testLogger())
	require.Eventually(t, func() bool {
		p, err := w.admin.ReplayPlan(context.Background(), plan.ID, policy)
		return err == nil && p.Status == "done"
	}, 20*time.Second, 20*time.Millisecond, "the resumer continues the plan to done")
	stopResumer()
	require.NoError(t, w.admin.WaitReplays(context.Background()))

	w.requireReplayedOnce(t, 1)
	d, err := w.admin.Event(context.Background(), w.events[len(w.events)-1].ID)
	require.NoError(t, err)
	require.Len(t, d.Replays, 1)
	require.Equal(t, "published", d.Replays[0].State)
	var actions []string
	require.NoError(t, w.DB.Pool.QueryRow(context.Background(),
		"SELECT array_agg(actor || ' ' || action ORDER BY id) FROM outbox_audit WHERE target = $1", plan.ID.String()).Scan(&actions))
	require.Equal(t, []string{"ops replay_plan", "ops replay_run", "system:replay-resumer replay_continue"}, actions)
}

// TestReplayDeadRunner: a runner that died (SIGKILL) leaves its plan
// running on a lease nobody renews. While the lease holds, run answers
// that the plan is running; once it has passed, run continues the plan
// from the first unpublished event to done.
func TestReplayDeadRunner(t *testing.T) {
	t.Parallel()
	w := replaySetup(t, 12)
	ctx := context.Background()
	policy := operate.ReplayPolicy{ApprovalThreshold: 100, RunLease: time.Second}
	plan, err := w.admin.PlanReplay(ctx, operate.ReplaySelector{IDs: w.ids()}, policy, ops)
	require.NoError(t, err)
	// What a runner killed after its fifth event leaves: five published
	// items, the rest planned, and a lease nobody renews.
	interrupted := w.interruptAfter(t, plan.ID, 5, policy)
	w.exec(t, `UPDATE outbox_replay_plan SET status = 'running', run_owner = 'dead-host:1:0000',
		run_lease_expires_at = clock_timestamp() + interval '1 second' WHERE id = $1`, plan.ID)

	_, err = w.admin.RunReplay(ctx, plan.ID, w.target, policy, ops2)
	require.ErrorIs(t, err, operate.ErrPlanState, "the lease still holds")
	require.ErrorContains(t, err, "dead-host:1:0000")
	var done operate.ReplayPlan
	require.Eventually(t, func() bool {
		done, err = w.admin.RunReplay(ctx, plan.ID, w.target, policy, ops2)
		return err == nil
	}, 10*time.Second, 100*time.Millisecond, "taken over once the lease has passed: %v", err)
	require.Equal(t, "done", done.Status)
	require.Equal(t, 12, done.Published)
	require.Equal(t, "ops", done.RunBy, "the first runner stays; the audit names the second")
	require.Greater(t, done.Published, interrupted, "the continuation published the rest")
	w.requireReplayedOnce(t, 1)
}

// TestReplayLostPlan: a runner whose plan was taken over (it stalled past
// its lease) stops at its next record and writes nothing more: the plan
// stays the new runner's.
func TestReplayLostPlan(t *testing.T) {
	t.Parallel()
	w := replaySetup(t, 20)
	ctx := context.Background()
	policy := operate.ReplayPolicy{ApprovalThreshold: 100, RunLease: 10 * time.Second}
	plan, err := w.admin.PlanReplay(ctx, operate.ReplaySelector{IDs: w.ids()}, policy, ops)
	require.NoError(t, err)
	takenAt := make(chan int, 1)
	w.whenPublished(plan.ID, 3, func() {
		// The takeover as startRun does it, the plan row locked first,
		// and how many events were recorded when it committed: while the
		// lock is held, no record of the old runner can commit.
		n := -1
		_ = pgx.BeginFunc(ctx, w.DB.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT 1 FROM outbox_replay_plan WHERE id = $1 FOR UPDATE", plan.ID); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "UPDATE outbox_replay_plan SET run_owner = 'successor' WHERE id = $1", plan.ID); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "SELECT count(*) FROM outbox_replay_item WHERE plan_id = $1 AND state = 'published'", plan.ID).Scan(&n)
		})
		takenAt <- n
	})
	slow := w.target
	slow.Rate = 20
	_, err = w.admin.RunReplay(ctx, plan.ID, slow, policy, ops)
	require.ErrorContains(t, err, "another runner took the plan over")
	p, err := w.admin.ReplayPlan(ctx, plan.ID, policy)
	require.NoError(t, err)
	require.Equal(t, "running", p.Status)
	require.Equal(t, "successor", p.RunOwner)
	published := <-takenAt
	require.Equal(t, published, p.Published, "nothing recorded after the takeover")
	copies := 0
	for _, n := range ids(w.ReadAll(t)) {
		copies += n - 1
	}
	require.LessOrEqual(t, copies, published+1, "at most the send in flight at the takeover")
}

// TestReplayApprovalWindow: the threshold counts what one admin replays
// alone over the rolling window, not per plan. Two small plans that add up
// past it: the second needs a second admin. A plan made before the window
// is counted again when it runs inside it. Another admin has a budget of
// their own.
func TestReplayApprovalWindow(t *testing.T) {
	t.Parallel()
	w := replaySetup(t, 8)
	ctx := context.Background()
	policy := operate.ReplayPolicy{ApprovalThreshold: 3}
	plan := func(actor operate.Actor, evs ...outbox.Event) operate.ReplayPlan {
		t.Helper()
		p, err := w.admin.PlanReplay(ctx, operate.ReplaySelector{IDs: w.ids(evs...)}, policy, actor)
		require.NoError(t, err)
		return p
	}

	first := plan(ops, w.events[0], w.events[1])
	require.False(t, first.NeedsApproval)
	second := plan(ops, w.events[2], w.events[3])
	require.True(t, second.NeedsApproval, "2 + 2 events by one admin exceed 3")
	_, err := w.admin.RunReplay(ctx, second.ID, w.target, policy, ops)
	require.ErrorIs(t, err, operate.ErrNeedsApproval)
	other := plan(ops2, w.events[4], w.events[5])
	require.False(t, other.NeedsApproval, "another admin's events are theirs")

	// A plan from before the window is counted when it runs in it.
	w.exec(t, "UPDATE outbox_replay_plan SET created_at = created_at - interval '25 hours' WHERE id = $1", first.ID)
	third := plan(ops, w.events[6], w.events[7])
	require.False(t, third.NeedsApproval, "the first plan is out of the window")
	_, err = w.admin.RunReplay(ctx, first.ID, w.target, policy, ops)
	require.ErrorIs(t, err, operate.ErrNeedsApproval, "running it now adds to the third plan")
	require.ErrorContains(t, err, "the 2 that ops replayed without a second admin in the last 24h0m0s exceed the threshold of 3")
	p, err := w.admin.ReplayPlan(ctx, first.ID, policy)
	require.NoError(t, err)
	require.True(t, p.NeedsApproval, "the plan now shows it needs a second admin")
	done, err := w.admin.RunReplay(ctx, third.ID, w.target, policy, ops)
	require.NoError(t, err)
	require.Equal(t, "done", done.Status)

	_, err = w.admin.ApproveReplay(ctx, first.ID, policy, ops2)
	require.NoError(t, err)
	done, err = w.admin.RunReplay(ctx, first.ID, w.target, policy, ops)
	require.NoError(t, err, "approved by a second admin")
	require.Equal(t, "done", done.Status)

	// A shorter window forgets sooner.
	w.exec(t, "UPDATE outbox_replay_plan SET created_at = created_at - interval '2 hours', run_started_at = run_started_at - interval '2 hours'")
	short := policy
	short.ApprovalWindow = time.Hour
	p, err = w.admin.PlanReplay(ctx, operate.ReplaySelector{IDs: w.ids(w.events[:3]...)}, short, ops)
	require.NoError(t, err)
	require.False(t, p.NeedsApproval)
}

// TestReplayApprovalExpires: an approval is valid for the policy's TTL on
// the database's clock; running a plan whose approval is older is refused
// (409 over HTTP, saying it expired and must be given again), and a second
// admin can approve it again.
func TestReplayApprovalExpires(t *testing.T) {
	t.Parallel()
	w := replaySetup(t, 2)
	ctx := context.Background()
	policy := operate.ReplayPolicy{ApprovalThreshold: 0}
	plan, err := w.admin.PlanReplay(ctx, operate.ReplaySelector{IDs: w.ids()}, policy, ops)
	require.NoError(t, err)
	require.True(t, plan.NeedsApproval)
	approved, err := w.admin.ApproveReplay(ctx, plan.ID, policy, ops2)
	require.NoError(t, err)
	require.WithinDuration(t, approved.ApprovedAt.Add(time.Hour), *approved.ApprovalExpiresAt, 0, "one hour by default")
	w.exec(t, "UPDATE outbox_replay_plan SET approved_at = approved_at - interval '61 minutes' WHERE id = $1", plan.ID)

	_, err = w.admin.RunReplay(ctx, plan.ID, w.target, policy, ops)
	require.ErrorIs(t, err, operate.ErrApprovalExpired)

	h := w.admin.Handler(operate.AdminHandlerConfig{
		Actor:  func(r *http.Request) string { return r.Header.Get("X-Actor") },
		Policy: policy,
		Target: func(context.Context) (operate.ReplayTarget, error) { return w.target, nil },
		Log:    testLogger(),
	})
	res := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/replays/"+plan.ID.String()+"/run", strings.NewReader(`{"reason": "go"}`))
	req.Header.Set("X-Actor", "ops")
	h.ServeHTTP(res, req)
	require.Equal(t, http.StatusConflict, res.Code)
	require.Equal(t, "application/problem+json", res.Header().Get("Content-Type"))
	var problem struct{ Detail string }
	require.NoError(t, json.Unmarshal(res.Body.Bytes(), &problem))
	require.Contains(t, problem.Detail, "the approval has expired; a second admin must approve the plan again")
	p, err := w.admin.ReplayPlan(ctx, plan.ID, policy)
	require.NoError(t, err)
	require.Equal(t, "approved", p.Status, "a refused run changes nothing")
	require.Equal(t, 0, w.published(t, plan.ID))

	_, err = w.admin.ApproveReplay(ctx, plan.ID, policy, ops)
	require.ErrorIs(t, err, operate.ErrSameApprover, "the planner still cannot approve")
	_, err = w.admin.ApproveReplay(ctx, plan.ID, policy, ops2)
	require.NoError(t, err, "approved again")
	done, err := w.admin.RunReplay(ctx, plan.ID, w.target, policy, ops)
	require.NoError(t, err)
	require.Equal(t, "done", done.Status)
	w.requireReplayedOnce(t, 1)
}
