package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestReplayKilledMidRun: `orders serve` is killed with SIGKILL while it
// runs a replay (O5). The dead runner leaves the plan running on a lease
// nobody renews; the restarted orders takes it over once the lease has
// passed (RELAY_LEASE, 3s here) and continues from the first event not
// recorded as published. Stopped with SIGTERM in turn, it leaves the plan
// interrupted, and a third orders finishes it. The notifier absorbs every
// copy as a duplicate: no email is sent twice.
func TestReplayKilledMidRun(t *testing.T) {
	t.Parallel()
	// Two events a second: the eight events take four seconds, long
	// enough to kill the runner in the middle.
	extra := map[string]string{"REPLAY_RATE": "2"}
	c := newChain(t, extra)
	notifier := start(t, "notifier", c.notifierEnv(nil), "serve")
	notifierURL := "http://" + c.notifierAddr
	waitReady(t, notifier, notifierURL+"/readyz")
	c.traffic(t)
	require.Eventually(t, func() bool { return len(c.smtp.Received()) == 7 }, 30*time.Second, 50*time.Millisecond,
		"one email per emailing event before the replay")
	ctx := context.Background()

	rows, err := c.odb.Pool.Query(ctx, "SELECT event_id FROM outbox ORDER BY created_at")
	require.NoError(t, err)
	events, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(t, err)
	require.Len(t, events, 8)
	admin := api{base: "http://" + c.ordersAddr, token: "dev-ops", http: &http.Client{Timeout: 5 * time.Second}}
	status, plan, err := admin.call("POST", "/admin/replays", "", map[string]any{"ids": events, "reason": "the notifier lost its projection"})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status, "%v", plan)
	planID := plan["id"].(string)
	status, body, err := admin.call("POST", "/admin/replays/"+planID+"/run", "", map[string]any{"reason": "the notifier lost its projection"})
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, status, "%v", body)

	published := func() (n int) {
		require.NoError(t, c.odb.Pool.QueryRow(ctx,
			"SELECT count(*) FROM outbox_replay_item WHERE plan_id = $1 AND state = 'published'", planID).Scan(&n))
		return n
	}
	planStatus := func() (s string) {
		require.NoError(t, c.odb.Pool.QueryRow(ctx, "SELECT status FROM outbox_replay_plan WHERE id = $1", planID).Scan(&s))
		return s
	}
	require.Eventually(t, func() bool { return published() >= 2 }, 20*time.Second, 20*time.Millisecond)
	c.orders.kill(t)
	atKill := published()
	require.Less(t, atKill, 8, "killed in the middle of the run")
	require.Equal(t, "running", planStatus(), "the dead runner could not say anything")

	env := ordersEnv(c.odb, c.ordersAddr, c.broker)
	for k, v := range extra {
		env[k] = v
	}
	restarted := start(t, "orders", env, "serve")
	waitReady(t, restarted, "http://"+c.ordersAddr+"/readyz")
	require.Eventually(t, func() bool { return published() >= atKill+2 }, 30*time.Second, 20*time.Millisecond,
		"the restarted orders continues the plan")

	// A clean stop (a deploy's SIGTERM) in the middle: the plan is left
	// interrupted, not failed, and the next orders finishes it.
	restarted.stop(t)
	atStop := published()
	require.Less(t, atStop, 8, "stopped in the middle of the run")
	require.Equal(t, "interrupted", planStatus())
	again := start(t, "orders", env, "serve")
	waitReady(t, again, "http://"+c.ordersAddr+"/readyz")
	require.Eventually(t, func() bool { return planStatus() == "done" }, 30*time.Second, 100*time.Millisecond,
		"the next orders continues the plan to done")
	require.Equal(t, 8, published(), "every event of the plan is published")
	var continuedBy []string
	require.NoError(t, c.odb.Pool.QueryRow(ctx, "SELECT array_agg(actor) FROM outbox_audit WHERE target = $1 AND action = 'replay_continue'",
		planID).Scan(&continuedBy))
	require.Equal(t, []string{"system:replay-resumer", "system:replay-resumer"}, continuedBy, "after the kill and after the stop")

	// Every replayed copy reaches the notifier as a duplicate (the one in
	// flight at the kill may have been sent twice): no email is sent again.
	require.Eventually(t, func() bool {
		dups, err := scrapeMetric(notifierURL+"/metrics", "inbox_duplicates_total")
		return err == nil && dups >= 8
	}, 30*time.Second, 100*time.Millisecond, "the notifier sees the eight replayed events")
	for _, m := range c.smtp.Received() {
		require.Equal(t, 1, c.smtp.Count(m.MessageID), "Message-ID %s sent once", m.MessageID)
	}
	require.Len(t, c.smtp.Received(), 7, "no email for a replayed event")
	t.Logf("killed after %d of 8 events, stopped after %d; the third orders published the rest", atKill, atStop)
}
