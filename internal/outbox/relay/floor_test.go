package relay_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox"
)

// TestLateCommitBelowTheReadFloor: reads start at the floor the last
// upkeep found (OutboxReadFloor), and a row written before that floor by a
// transaction that commits only after it is still delivered, once the
// next upkeep moves the floor down to it. The transaction here stays open
// until the relay's floor has passed its row, as a slow business
// transaction would.
func TestLateCommitBelowTheReadFloor(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.relay(t, nil)
	r.SetReadFloorLag(10 * time.Millisecond)
	start(t, r)

	ctx := t.Context()
	tx, err := e.DB.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	late := event("late", 1)
	late.ID = uuid.New()
	require.NoError(t, testWriter.Insert(ctx, tx, []outbox.Event{late}))
	var written time.Time
	require.NoError(t, tx.QueryRow(ctx, "SELECT next_attempt_at FROM outbox WHERE event_id = $1", late.ID).Scan(&written))
	require.Eventually(t, func() bool { return r.ReadFloor().After(written) }, 10*time.Second, 10*time.Millisecond,
		"the relay's reads start after the uncommitted row")
	require.NoError(t, tx.Commit(ctx))

	e.WaitDelivered(t, 10*time.Second)
	require.Equal(t, 1, ids(e.ReadAll(t))[late.ID])
}
