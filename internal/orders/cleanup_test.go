package orders

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestKeyCleanup: idempotency keys older than the retention go, in
// batches; recent ones stay and still replay; the orders stay.
func TestKeyCleanup(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	for i := range 5 {
		_, _, err := f.svc.Place(ctx, alice, PlaceOrder{Input: newInput(), IdempotencyKey: fmt.Sprintf("old-%d", i)})
		require.NoError(t, err)
	}
	_, err := f.pool.Exec(ctx, "UPDATE idempotency_keys SET created_at = now() - interval '2 days'")
	require.NoError(t, err)
	recent, _, err := f.svc.Place(ctx, alice, PlaceOrder{Input: newInput(), IdempotencyKey: "recent"})
	require.NoError(t, err)

	n, err := NewKeyCleanup(f.pool).Run(ctx, 24*time.Hour, 2, time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, int64(5), n)
	var keys, orders int
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM idempotency_keys), (SELECT count(*) FROM orders)").Scan(&keys, &orders))
	require.Equal(t, 1, keys)
	require.Equal(t, 6, orders, "deleting a key never deletes its order")
	again, replayed, err := f.svc.Place(ctx, alice, PlaceOrder{Input: newInput(), IdempotencyKey: "recent"})
	require.NoError(t, err)
	require.True(t, replayed)
	require.Equal(t, recent.ID, again.ID)

	_, err = NewKeyCleanup(f.pool).Run(ctx, time.Hour, 0, 0)
	require.Error(t, err)
}
