package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/pgtest"
	"github.com/outboxref/orders/internal/testlog"
)

// TestReplayConfig: the four-eyes window and the approval TTL default to
// 24h and 1h and must be positive.
func TestReplayConfig(t *testing.T) {
	t.Parallel()
	env := func(kv ...string) func(string) string {
		m := map[string]string{"AUTH_TOKENS": "t1=alice:customer"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	c, err := loadConfig(env())
	require.NoError(t, err)
	require.Equal(t, 24*time.Hour, c.Ops.ReplayApprovalWindow)
	require.Equal(t, time.Hour, c.Ops.ReplayApprovalTTL)
	c, err = loadConfig(env("REPLAY_APPROVAL_TTL", "15m", "REPLAY_APPROVAL_WINDOW", "12h"))
	require.NoError(t, err)
	require.Equal(t, 15*time.Minute, c.Ops.ReplayApprovalTTL)
	require.Equal(t, 12*time.Hour, c.Ops.ReplayApprovalWindow)
	_, err = loadConfig(env("REPLAY_APPROVAL_TTL", "0s"))
	require.ErrorContains(t, err, "REPLAY_APPROVAL_TTL")
}

// TestRelayContinuesInterruptedReplay: `orders relay` continues, at start,
// a replay that a stopped `orders serve` left interrupted, to done.
func TestRelayContinuesInterruptedReplay(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, schema.Orders()...)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(6, "orders.events"))
	require.NoError(t, err)
	defer c.Close()
	ctx := context.Background()
	order, event, plan := uuid.NewString(), uuid.New(), uuid.New()
	_, err = db.Pool.Exec(ctx, `INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload,
		state, delivered_at) VALUES ($1, 'order', $2, 1, 'order.placed', 1, '{}', 'delivered', now())`, event, order)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO outbox_replay_plan (id, created_by, reason, selector, needs_approval, status, run_by, run_started_at)
		VALUES ($1, 'ops', 'rebuild', '{}', false, 'interrupted', 'ops', now())`, plan)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO outbox_replay_item (plan_id, event_id, event_type, created_at, state)
		VALUES ($1, $2, 'order.placed', now(), 'planned')`, plan, event)
	require.NoError(t, err)

	vars := map[string]string{
		"DATABASE_URL":       db.URL,
		"KAFKA_BROKERS":      strings.Join(c.ListenAddrs(), ","),
		"RELAY_METRICS_ADDR": net.JoinHostPort("127.0.0.1", freePort(t)),
	}
	runCtx, cancel := context.WithCancel(ctx)
	var out testlog.Buffer
	done := make(chan error, 1)
	go func() { done <- runRelayOnly(runCtx, func(k string) string { return vars[k] }, &out) }()
	require.Eventually(t, func() bool {
		var status string
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT status FROM outbox_replay_plan WHERE id = $1", plan).Scan(&status))
		return status == "done"
	}, 20*time.Second, 50*time.Millisecond, "the relay continues the plan:\n%s", &out)
	cancel()
	require.NoError(t, <-done)
	require.Contains(t, out.String(), `"replay continued"`)
}
