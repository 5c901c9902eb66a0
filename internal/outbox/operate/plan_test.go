package operate_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox/internal/outboxtest"
	"github.com/outboxref/orders/internal/outbox/operate/internal/opsdb"
)

// TestCleanupKeepsItsOrderOnABacklog: each batch of the retention cleanup
// reads a batch in its index's order, and sorts nothing, on a backlog the
// planner has no statistics for (outboxtest.LoadBacklog). Each query's
// generated text is run under EXPLAIN ANALYZE with the settings the
// cleanup's session has. A batch that reads every row past the cutoff and
// sorts it costs O(backlog), and a run O(backlog²).
func TestCleanupKeepsItsOrderOnABacklog(t *testing.T) {
	t.Parallel()
	db := outboxtest.NewDB(t)
	outboxtest.LoadBacklog(t, db)
	for _, tc := range []struct {
		name string
		run  func(ctx context.Context, q *opsdb.Queries)
	}{
		{"ArchiveDelivered", func(ctx context.Context, q *opsdb.Queries) {
			rows, err := q.ArchiveDelivered(ctx, opsdb.ArchiveDeliveredParams{RetentionSeconds: 7 * 24 * 3600,
				AfterDeliveredAt: time.Unix(0, 0), BatchSize: 500})
			require.NoError(t, err)
			require.Len(t, rows, 500)
		}},
		{"DirectLogCleanup", func(ctx context.Context, q *opsdb.Queries) {
			n, err := q.DirectLogCleanup(ctx, opsdb.DirectLogCleanupParams{SentBefore: time.Now().Add(-7 * 24 * time.Hour), BatchSize: 500})
			require.NoError(t, err)
			require.EqualValues(t, 500, n)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := outboxtest.ExplainGenerated(t, db, opsdb.CleanupInIndexOrder, func(ctx context.Context, tx pgx.Tx) {
				tc.run(ctx, opsdb.New(tx))
			})
			t.Log(plan)
			require.Zero(t, plan.SortedRows(), "sorts the backlog:\n%s", plan)
			require.LessOrEqual(t, plan.RowsRead("outbox", "outbox_direct_log"), int64(1_100), "reads the backlog:\n%s", plan)
		})
	}
}
