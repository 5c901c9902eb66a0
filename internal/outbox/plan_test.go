package outbox_test

import (
	"context"
	"testing"

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
