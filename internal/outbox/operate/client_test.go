package operate_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox/operate"
	"github.com/outboxref/orders/internal/outbox/problem"
)

// TestAdminClient drives every endpoint of the operations' HTTP API through
// AdminClient, against Admin.Handler mounted under /admin as a service
// mounts it: the answers decode into the same types the handler encodes,
// a refusal comes back as the *problem.Problem the handler wrote, and a
// replay approved by a second admin runs to the end.
func TestAdminClient(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	inserted := e.Insert(t, event("agg-1", 1), event("agg-2", 1))
	parked, delivered := inserted[0], inserted[1]
	_, err := e.DB.Pool.Exec(ctx, `UPDATE outbox SET state = 'parked', attempts = 3, last_error_class = 'unknown_schema_version',
		last_error = 'no schema', next_attempt_at = now() WHERE event_id = $1`, parked.ID)
	require.NoError(t, err)
	_, err = e.DB.Pool.Exec(ctx, `UPDATE outbox SET state = 'delivered', delivered_at = now(), broker_partition = 0, broker_offset = 0
		WHERE event_id = $1`, delivered.ID)
	require.NoError(t, err)

	cl, err := kgo.NewClient(append(e.Conn, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	bg, stop := context.WithCancel(ctx)
	admin := e.admin()
	t.Cleanup(func() { stop(); _ = admin.WaitReplays(context.Background()) })
	// The bearer token is the subject: this test's stand-in for the
	// service's authentication.
	h := admin.Handler(operate.AdminHandlerConfig{
		Actor:      func(r *http.Request) string { return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ") },
		Background: bg,
		Log:        testLogger(),
		Target: func(context.Context) (operate.ReplayTarget, error) {
			return operate.ReplayTarget{Client: cl, Topic: topic, Source: "urn:outboxref:test", Rate: 1000}, nil
		},
	})
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, c2 := operate.NewAdminClient(srv.URL+"/admin/", "ops"), operate.NewAdminClient(srv.URL+"/admin", "ops2")

	stats, err := c.Stats(ctx)
	require.NoError(t, err)
	require.Contains(t, stats, operate.Stat{EventType: strictType, State: "parked", Count: 1, Oldest: stats[indexOf(stats, "parked")].Oldest})

	list, err := c.Parked(ctx, operate.ParkedFilter{EventType: strictType, AggregateID: "agg-1", Since: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, parked.ID, list[0].EventID)
	require.Equal(t, "unknown_schema_version", list[0].ErrorClass)
	list, err = c.Parked(ctx, operate.ParkedFilter{AggregateID: "agg-2"})
	require.NoError(t, err)
	require.Empty(t, list)

	_, err = c.Repair(ctx, parked.ID, operate.RepairRequest{Payload: json.RawMessage(`{"n": "not a number"}`), Reason: "fix"})
	var p *problem.Problem
	require.True(t, errors.As(err, &p), "a refusal is the handler's problem document: %v", err)
	require.Equal(t, http.StatusBadRequest, p.Status)
	require.Contains(t, p.Detail, "repair refused")
	_, err = c.Repair(ctx, parked.ID, operate.RepairRequest{Payload: json.RawMessage(`{"n": 7}`)})
	require.True(t, errors.As(err, &p))
	require.Equal(t, http.StatusBadRequest, p.Status, "a write without a reason")
	d, err := c.Repair(ctx, parked.ID, operate.RepairRequest{Payload: json.RawMessage(`{"n": 7}`), Reason: "fix"})
	require.NoError(t, err)
	require.JSONEq(t, `{"n": 7}`, string(d.Payload))

	res, err := c.Resume(ctx, operate.ResumeRequest{IDs: []uuid.UUID{parked.ID}, Reason: "repaired"})
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{parked.ID}, res.Resumed)
	d, err = c.Event(ctx, parked.ID)
	require.NoError(t, err)
	require.Equal(t, "pending", d.State)
	require.Len(t, d.Audit, 2)
	require.Equal(t, "ops", d.Audit[0].Actor)
	_, err = c.Event(ctx, uuid.New())
	require.True(t, errors.As(err, &p))
	require.Equal(t, http.StatusNotFound, p.Status)

	plan, err := c.PlanReplay(ctx, operate.PlanRequest{ReplaySelector: operate.ReplaySelector{From: time.Now().Add(-time.Hour),
		To: time.Now().Add(time.Hour)}, Reason: "rebuild"})
	require.NoError(t, err)
	require.True(t, plan.NeedsApproval)
	require.Equal(t, 1, plan.Events, "the delivered event; the pending one is skipped")
	_, err = c.RunReplay(ctx, plan.ID, "go")
	require.True(t, errors.As(err, &p))
	require.Equal(t, http.StatusConflict, p.Status, "not approved yet")
	_, err = c.ApproveReplay(ctx, plan.ID, "mine")
	require.True(t, errors.As(err, &p))
	require.Equal(t, http.StatusConflict, p.Status, "not by the admin who planned it")
	plan, err = c2.ApproveReplay(ctx, plan.ID, "checked")
	require.NoError(t, err)
	require.Equal(t, "ops2", plan.ApprovedBy)
	plan, err = c.RunReplay(ctx, plan.ID, "go")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		plan, err = c.ReplayPlan(ctx, plan.ID)
		return err == nil && plan.Status == "done"
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, 1, plan.Published)

	modes, err := c.PublishModes(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, modes)
	change, err := c.SetPublishMode(ctx, looseType, operate.PublishModeRequest{Mode: operate.ModeShadow, Reason: "compare"})
	require.NoError(t, err)
	require.Equal(t, operate.PublishModeChange{EventType: looseType, From: operate.ModeOutbox, To: operate.ModeShadow}, change)
	_, err = c.SetPublishMode(ctx, looseType, operate.PublishModeRequest{Mode: "sideways", Reason: "x"})
	require.True(t, errors.As(err, &p))
	require.Equal(t, http.StatusBadRequest, p.Status)
	since := time.Now().Add(-time.Hour).Truncate(time.Second)
	rep, err := c.ShadowReport(ctx, looseType, since)
	require.NoError(t, err)
	require.True(t, rep.Since.Equal(since), "the since sent is the since used: %s", rep.Since)

	// The service's authentication answers before the handler: its
	// problem comes back the same way, and so does a page that is none.
	_, err = operate.NewAdminClient(srv.URL+"/elsewhere", "ops").Stats(ctx)
	require.True(t, errors.As(err, &p))
	require.Equal(t, http.StatusNotFound, p.Status)
}

func indexOf(stats []operate.Stat, state string) int {
	for i, s := range stats {
		if s.State == state {
			return i
		}
	}
	return 0
}
