package operate_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
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
			r, err := q.DirectLogCleanup(ctx, opsdb.DirectLogCleanupParams{SentBefore: time.Now().Add(-7 * 24 * time.Hour),
				SentFrom: time.Unix(0, 0), BatchSize: 500})
			require.NoError(t, err)
			require.EqualValues(t, 500, r.Deleted)
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

// TestDirectLogCleanupSeeksPastWhatItDeleted: a deleted line's entry stays
// in outbox_direct_log_sent_idx until the table is vacuumed, so a cleanup
// whose every batch walked the index from its start would step over all
// the batches before it: time quadratic in the log. Each batch starts at
// the last send time the one before it deleted. With 39,000 of 40,000
// expired lines deleted (autovacuum off), the next batch touches a handful
// of the index's blocks from there, against hundreds from the start.
func TestDirectLogCleanupSeeksPastWhatItDeleted(t *testing.T) {
	t.Parallel()
	db := outboxtest.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		ALTER TABLE outbox_direct_log SET (autovacuum_enabled = false);
		INSERT INTO outbox_direct_log (event_id, event_type, publish_mode, sent_at)
		SELECT md5('d' || g)::uuid, 'thing.happened', 'direct', now() - interval '40 days' + g * interval '1 ms'
		FROM generate_series(1, 40000) g;
		ANALYZE outbox_direct_log;
		DELETE FROM outbox_direct_log WHERE sent_at <= (SELECT sent_at FROM outbox_direct_log ORDER BY sent_at OFFSET 38999 LIMIT 1);`)
	require.NoError(t, err)
	// Where the run's next batch starts: the send time of the last line
	// deleted, or (the same walk, as the bound is inclusive) of the first
	// line left.
	var last time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT min(sent_at) FROM outbox_direct_log`).Scan(&last))

	blocks := func(from time.Time) (int64, outboxtest.Plan) {
		plan := outboxtest.ExplainGenerated(t, db, opsdb.CleanupInIndexOrder, func(ctx context.Context, tx pgx.Tx) {
			r, err := opsdb.New(tx).DirectLogCleanup(ctx, opsdb.DirectLogCleanupParams{
				SentBefore: time.Now().Add(-7 * 24 * time.Hour), SentFrom: from, BatchSize: 500})
			require.NoError(t, err)
			require.EqualValues(t, 500, r.Deleted)
		})
		return plan.IndexBlocks("outbox_direct_log_sent_idx"), plan
	}
	fromLast, plan := blocks(last)
	t.Logf("from the last deleted line, %d blocks:\n%s", fromLast, plan)
	fromStart, plan := blocks(time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC))
	t.Logf("from the start, %d blocks:\n%s", fromStart, plan)
	require.LessOrEqual(t, fromLast, int64(30), "the batch after 39,000 deleted lines walks them")
	require.GreaterOrEqual(t, fromStart, int64(80), "the walk from the start should cross the deleted lines' entries")
}

// TestRepairsFindParkedRowsByPrimaryKey: a repair and each batch of a bulk
// resume look parked rows up by id, and must cost one index lookup per id
// however many rows are pending. Repairs come during incidents, when a
// backlog is likely. With the state compared as a literal, the partial
// index of undelivered rows can answer the statement, and with statistics
// taken while nothing was pending the planner walks all of them for the
// ids (OutboxConfirm in the outbox's queries has the same trap and the same
// cure). Here the table was analysed holding 20,000 delivered rows, then
// took 20,000 pending rows and 10 parked ones.
func TestRepairsFindParkedRowsByPrimaryKey(t *testing.T) {
	t.Parallel()
	db := outboxtest.NewDB(t)
	parked := parkedAmongPending(t, db)

	for _, tc := range []struct {
		name string
		run  func(ctx context.Context, q *opsdb.Queries)
	}{
		{"GroupParkedLock", func(ctx context.Context, q *opsdb.Queries) {
			locked, err := q.GroupParkedLock(ctx, parked)
			require.NoError(t, err)
			require.Len(t, locked, 10)
		}},
		{"AdminRepair", func(ctx context.Context, q *opsdb.Queries) {
			_, err := q.AdminRepair(ctx, opsdb.AdminRepairParams{Payload: []byte(`{}`), SchemaVersion: 1, Note: "fixed", EventID: parked[0]})
			require.NoError(t, err)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := outboxtest.ExplainGenerated(t, db, "", func(ctx context.Context, tx pgx.Tx) {
				tc.run(ctx, opsdb.New(tx))
			})
			t.Log(plan)
			require.LessOrEqual(t, plan.RowsRead("outbox"), int64(100), "walks the pending rows:\n%s", plan)
		})
	}
}

// parkedAmongPending analyses the outbox holding 20,000 delivered rows,
// then adds 20,000 pending rows and 10 parked ones, and returns the parked
// rows' ids: the statistics say nothing is undelivered, the table holds a
// backlog, and a few events of it are parked, as during an outage.
func parkedAmongPending(t *testing.T, db *outboxtest.DB) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	outboxtest.AnalyseDelivered(t, db, 20000)
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload,
		                    created_at, next_attempt_at, state, last_error_class, last_error)
		SELECT md5('e' || g)::uuid, 'thing', 'a' || g, 1, 'thing.happened', 1, '{}',
		       now() - interval '1 hour', now() - interval '1 hour',
		       CASE WHEN g <= 10 THEN 'parked' ELSE 'pending' END,
		       CASE WHEN g <= 10 THEN 'deterministic' END, CASE WHEN g <= 10 THEN 'refused' END
		FROM generate_series(1, 20010) AS g`)
	require.NoError(t, err)
	rows, err := db.Pool.Query(ctx, `SELECT event_id FROM outbox WHERE state = 'parked' ORDER BY event_id`)
	require.NoError(t, err)
	parked, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(t, err)
	require.Len(t, parked, 10)
	return parked
}

// TestParkedRowsAreReadFromTheirOwnIndex: what an operator does with parked
// events (list them, group them, resume some by id or all of a type) reads
// the parked rows alone, from outbox_parked_idx, whether the statistics
// know of the backlog or not. Before that index (migration 00010) only the
// index of undelivered rows could answer state = 'parked', and each of
// these statements walked every pending row too: under an outage's
// backlog, the whole backlog for each page an operator looked at.
func TestParkedRowsAreReadFromTheirOwnIndex(t *testing.T) {
	t.Parallel()
	db := outboxtest.NewDB(t)
	parked := parkedAmongPending(t, db)
	typ := "thing.happened"
	cases := []struct {
		name string
		run  func(ctx context.Context, q *opsdb.Queries)
	}{
		{"AdminParked", func(ctx context.Context, q *opsdb.Queries) {
			rows, err := q.AdminParked(ctx, opsdb.AdminParkedParams{RowLimit: 50})
			require.NoError(t, err)
			require.Len(t, rows, 10)
		}},
		{"AdminParkedOfAType", func(ctx context.Context, q *opsdb.Queries) {
			rows, err := q.AdminParked(ctx, opsdb.AdminParkedParams{EventType: &typ, RowLimit: 50})
			require.NoError(t, err)
			require.Len(t, rows, 10)
		}},
		{"GroupParkedRows", func(ctx context.Context, q *opsdb.Queries) {
			rows, err := q.GroupParkedRows(ctx)
			require.NoError(t, err)
			require.Len(t, rows, 10)
		}},
		{"AdminParkedForResumeByID", func(ctx context.Context, q *opsdb.Queries) {
			rows, err := q.AdminParkedForResume(ctx, opsdb.AdminParkedForResumeParams{EventIDs: parked[:3]})
			require.NoError(t, err)
			require.Len(t, rows, 3)
		}},
		{"AdminResumeByID", func(ctx context.Context, q *opsdb.Queries) {
			rows, err := q.AdminResume(ctx, opsdb.AdminResumeParams{EventIDs: parked[:3]})
			require.NoError(t, err)
			require.Len(t, rows, 3)
		}},
		{"AdminResumeOfAType", func(ctx context.Context, q *opsdb.Queries) {
			rows, err := q.AdminResume(ctx, opsdb.AdminResumeParams{EventIDs: []uuid.UUID{}, EventType: &typ})
			require.NoError(t, err)
			require.Len(t, rows, 10)
		}},
	}
	check := func(t *testing.T) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				plan := outboxtest.ExplainGenerated(t, db, "", func(ctx context.Context, tx pgx.Tx) {
					tc.run(ctx, opsdb.New(tx))
				})
				t.Log(plan)
				require.LessOrEqual(t, plan.RowsRead("outbox"), int64(100), "walks the pending rows:\n%s", plan)
			})
		}
	}
	t.Run("StaleStatistics", check)
	_, err := db.Pool.Exec(context.Background(), `ANALYZE outbox`)
	require.NoError(t, err)
	t.Run("FreshStatistics", check)
}
