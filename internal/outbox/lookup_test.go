package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox"
)

// What a caller passes to EventsOf: its pool, a connection or a
// transaction.
var (
	_ outbox.DB = (*pgxpool.Pool)(nil)
	_ outbox.DB = (*pgx.Conn)(nil)
	_ outbox.DB = pgx.Tx(nil)
)

// TestEventsOf (C7): the outbox answers which event_id it wrote at each
// version of an aggregate, in version order, through the pool or inside a
// transaction, and with nothing for another aggregate.
func TestEventsOf(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	written := []outbox.Event{event("agg-1", 1), event("agg-1", 2), event("agg-2", 1)}
	require.NoError(t, testWriter.Insert(ctx, tx, written))

	inTx, err := outbox.EventsOf(ctx, tx, "test", "agg-1")
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	viaPool, err := outbox.EventsOf(ctx, db.Pool, "test", "agg-1")
	require.NoError(t, err)

	want := []outbox.EventRef{
		{ID: written[0].ID, AggregateVersion: 1, Type: strictType},
		{ID: written[1].ID, AggregateVersion: 2, Type: strictType},
	}
	require.Equal(t, want, inTx)
	require.Equal(t, want, viaPool)

	none, err := outbox.EventsOf(ctx, db.Pool, "test", "agg-3")
	require.NoError(t, err)
	require.Empty(t, none)
}
