package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxref/orders/internal/outbox/internal/outboxtest"
)

// TestQueriesKeepTheirOrderOnABacklog: the relay's read takes a handful
// of rows in its index's order, and sorts none, on a backlog the planner
// has no statistics for (outboxtest.LoadBacklog). The query's generated
// text is run under EXPLAIN ANALYZE. A plan that reads every due row and
// sorts it to return the first hundred costs O(backlog) per batch,
// O(backlog²) to drain it. The read is made as by one of four relays,
// owning four of the sixteen partitions: it walks past the rows of the
// other relays' partitions, so it reads about four times the batch. The
// retention cleanup's queries are checked the same way in package operate.
func TestQueriesKeepTheirOrderOnABacklog(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	outboxtest.LoadBacklog(t, db)
	// The first hundred due events of four partitions, past the rows
	// leased by a relay of the previous version; each event's earlier
	// version is looked up once.
	plan := outboxtest.ExplainGenerated(t, db, outboxdb.ClaimInIndexOrder, func(ctx context.Context, tx pgx.Tx) {
		rows, err := outboxdb.New(tx).OutboxRead(ctx, outboxdb.OutboxReadParams{Partitions: []int32{0, 5, 10, 15},
			InFlight: []uuid.UUID{}, IndependentTypes: []string{}, BatchSize: 100})
		require.NoError(t, err)
		require.Len(t, rows, 100)
	})
	t.Log(plan)
	require.Zero(t, plan.SortedRows(), "sorts the backlog:\n%s", plan)
	require.LessOrEqual(t, plan.RowsRead("outbox"), int64(1_000), "reads the backlog:\n%s", plan)
}

// TestReadStartsAtItsFloor: a confirm leaves the index entries of the rows
// it delivered in outbox_pending_due_idx until the table is vacuumed, and a
// read from the start of the index steps over every one of them, each
// time (with autovacuum's default threshold, up to a fifth of the table).
// The relay's reads start at the floor OutboxReadFloor finds instead: the
// first pending row. Here 40,000 events were written and the first 39,000
// delivered by confirms; the read's walk of the index from the floor
// touches a fraction of the blocks the walk from the start does (whether
// or not an earlier walk could mark the delivered rows' entries dead,
// which an open snapshot anywhere on the server prevents), and the read
// returns the same rows.
func TestReadStartsAtItsFloor(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `ALTER TABLE outbox SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload,
		                    created_at, next_attempt_at)
		SELECT md5('e' || g)::uuid, 'thing', 'a' || g, 1, 'thing.happened', 1, '{}',
		       now() - interval '1 hour' + g * interval '1 ms', now() - interval '1 hour' + g * interval '1 ms'
		FROM generate_series(1, 40000) AS g`)
	require.NoError(t, err)
	for range 39 {
		_, err := db.Pool.Exec(ctx, `
			UPDATE outbox SET state = 'delivered', delivered_at = now()
			WHERE event_id IN (SELECT event_id FROM outbox WHERE state = 'pending'
			                   ORDER BY next_attempt_at, created_at, aggregate_version LIMIT 1000)`)
		require.NoError(t, err)
	}
	all := make([]int32, 16)
	for i := range all {
		all[i] = int32(i)
	}
	floor, err := outboxdb.OutboxReadFloorInIndexOrder(ctx, db.Pool, outboxdb.OutboxReadFloorParams{Partitions: all, LateSeconds: 5})
	require.NoError(t, err)
	var first time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT min(next_attempt_at) FROM outbox WHERE state = 'pending'`).Scan(&first))
	require.True(t, floor.Equal(first), "the floor is the first pending row's due time: %s, want %s", floor, first)

	read := func(floor time.Time) (outboxtest.Plan, []uuid.UUID) {
		var got []uuid.UUID
		plan := outboxtest.ExplainGenerated(t, db, outboxdb.ClaimInIndexOrder, func(ctx context.Context, tx pgx.Tx) {
			rows, err := outboxdb.New(tx).OutboxRead(ctx, outboxdb.OutboxReadParams{Partitions: all, ReadFloor: floor,
				InFlight: []uuid.UUID{}, IndependentTypes: []string{}, BatchSize: 100})
			require.NoError(t, err)
			require.Len(t, rows, 100)
			for _, r := range rows {
				got = append(got, r.EventID)
			}
		})
		return plan, got
	}
	read(time.Time{}) // a first walk past the delivered rows, as the relay's reads before this one
	fromStart, want := read(time.Time{})
	fromFloor, got := read(floor)
	const index = "outbox_pending_due_idx"
	t.Logf("blocks touched by the walk of %s: %d from the start, %d from the floor", index, fromStart.IndexBlocks(index), fromFloor.IndexBlocks(index))
	require.Equal(t, want, got)
	require.Positive(t, fromFloor.IndexBlocks(index), "the read walks %s:\n%s", index, fromFloor)
	require.Less(t, 10*fromFloor.IndexBlocks(index), fromStart.IndexBlocks(index), "the read from the floor steps over the delivered rows:\n%s", fromFloor)
}
