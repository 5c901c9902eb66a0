package notify

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/notify/notifydb"
	"github.com/outboxref/orders/internal/pgtest"
)

// TestLedgerQueriesKeepTheirOrderOnABacklog: the sender's claim, the
// stuck-send sweep, the stale-email skip and the ledger cleanup each read a
// handful of rows, and sort none, on a backlog the planner has no
// statistics for. The ledger is analysed while empty (as it was before an
// outage), then loaded with 50,000 due emails behind 2,000 unknown ones
// held for an operator, 2,000 waiting out a retry delay, a few sends in
// flight or abandoned, and 21,000 finished ones. Each query's generated
// text is run under EXPLAIN ANALYZE: a plan that reads the due rows and
// sorts them to take the first costs O(backlog) per email, O(backlog²) to
// drain it; only an index whose order is the query's ORDER BY, restricted
// to the rows the query wants, keeps each claim constant.
func TestLedgerQueriesKeepTheirOrderOnABacklog(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, schema.Notifier()...)
	ctx := context.Background()
	pgtest.FreezeStats(t, db.Pool, "email_send")
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type, aggregate_version, event_time,
		                        recipient, subject, body, state, attempts, next_attempt_at, sending_since, created_at,
		                        last_error_class, skip_reason)
		SELECT 'k' || g, md5('e' || g)::uuid, '<k' || g || '>', md5('o' || g)::uuid, 'order.placed', 1,
		       CASE WHEN g <= 20 THEN now() - interval '3 days' ELSE now() - interval '1 hour' END,
		       'a@example.com', 's', 'b', s.state, s.attempts,
		       now() + s.due_in + g * interval '1 ms',
		       CASE WHEN s.state = 'sending' THEN now() + s.due_in END,
		       now() + s.age,
		       CASE WHEN s.state = 'unknown' THEN 'unknown' END,
		       CASE WHEN s.state = 'skipped' THEN 'stale' END
		FROM generate_series(1, 77012) g
		CROSS JOIN LATERAL (SELECT * FROM (VALUES
		    -- due, in the order they were written
		    (50000, 'pending', 0, interval '-1 hour',   interval '-1 hour'),
		    -- held for an operator (EMAIL_UNKNOWN_POLICY=hold), due long ago
		    (52000, 'unknown', 1, interval '-2 hours',  interval '-2 hours'),
		    -- waiting out a retry delay
		    (54000, 'pending', 1, interval '1 hour',    interval '-1 hour'),
		    -- abandoned by a dead sender, then in flight
		    (54004, 'sending', 1, interval '-1 hour',   interval '-1 hour'),
		    (54012, 'sending', 1, interval '0',         interval '-1 hour'),
		    -- finished, past the retention, then within it
		    (55012, 'sent',    1, interval '-40 days',  interval '-40 days'),
		    (76012, 'sent',    1, interval '-10 days',  interval '-10 days'),
		    (77012, 'skipped', 0, interval '-10 days',  interval '-10 days')
		) v(upto, state, attempts, due_in, age) WHERE g <= v.upto ORDER BY v.upto LIMIT 1) s`)
	require.NoError(t, err)

	// Each query is run the way the sender runs it: the claim and the
	// cleanup through indexOrder, the sweeps as they are.
	capture := func(fn func(ctx context.Context, q *notifydb.Queries)) []pgtest.Query {
		return pgtest.Capture(t, db.URL, func(ctx context.Context, tx pgx.Tx) { fn(ctx, notifydb.New(tx)) })
	}
	captureIndexOrder := func(fn func(ctx context.Context, q *notifydb.Queries)) []pgtest.Query {
		return pgtest.Capture(t, db.URL, func(ctx context.Context, tx pgx.Tx) { fn(ctx, notifydb.New(indexOrder{db: tx})) })
	}
	claim := func(resend bool, workers, worker int32) []pgtest.Query {
		return captureIndexOrder(func(ctx context.Context, q *notifydb.Queries) {
			_, err := q.EmailSendClaimOne(ctx, notifydb.EmailSendClaimOneParams{ClaimToken: uuid.New(), ClaimedBy: "test",
				ResendUnknown: resend, MaxAttempts: 10, Workers: workers, Worker: worker})
			require.NoError(t, err, "a due row is claimed")
		})
	}
	for _, tc := range []struct {
		name    string
		query   []pgtest.Query
		maxRead int64
		// maxSorted: the claim's two branches each bring one candidate;
		// the cleanup sorts the batch it deleted to find its last row.
		// Anything more is a sort of the backlog.
		maxSorted int64
	}{
		// One worker: the first due row. Held unknown rows are not in the way.
		{"ClaimOneWorker", claim(false, 1, 0), 5, 2},
		// Four workers, the last one, resending unknown rows: both branches
		// walk their index until a row of this worker's share, about four
		// rows each.
		{"ClaimWorkerShareResend", claim(true, 4, 3), 100, 2},
		{"SweepStuck", capture(func(ctx context.Context, q *notifydb.Queries) {
			rows, err := q.EmailSendSweepStuck(ctx, notifydb.EmailSendSweepStuckParams{MaxAttempts: 10, TimeoutSeconds: 60})
			require.NoError(t, err)
			require.Len(t, rows, 4, "the abandoned sends, not the live ones")
		}), 20, 2},
		{"SkipStale", capture(func(ctx context.Context, q *notifydb.Queries) {
			rows, err := q.EmailSendSkipStale(ctx, 24*3600)
			require.NoError(t, err)
			require.Len(t, rows, 20)
		}), 50, 2},
		{"Cleanup", captureIndexOrder(func(ctx context.Context, q *notifydb.Queries) {
			r, err := q.EmailSendCleanup(ctx, notifydb.EmailSendCleanupParams{TtlSeconds: 30 * 24 * 3600, BatchSize: 500,
				AfterCreatedAt: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)})
			require.NoError(t, err)
			require.EqualValues(t, 500, r.Deleted)
		}), 1_100, 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := pgtest.Explain(t, db.Pool, tc.query...)
			t.Log(plan)
			require.LessOrEqual(t, plan.SortedRows(), tc.maxSorted, "sorts the backlog:\n%s", plan)
			require.LessOrEqual(t, plan.RowsRead("email_send"), tc.maxRead, "reads the backlog:\n%s", plan)
		})
	}
}

// TestLedgerCleanupSeeksPastWhatItDeleted: a deleted email's entry stays in
// email_send_finished_cleanup_idx until the ledger is vacuumed, so a
// cleanup whose every batch walked the index from its start would step
// over all the batches before it: time quadratic in the backlog. Each
// batch starts past the last email the one before it deleted. A run
// deletes 40,000 sent emails in batches of 1,000 with autovacuum off; then
// 100 more expire, and the run's final statement, run again, touches a
// handful of the index's blocks from its cursor against hundreds from the
// start.
func TestLedgerCleanupSeeksPastWhatItDeleted(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, schema.Notifier()...)
	ctx := context.Background()
	load := func(from, to int) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, `
			INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type, aggregate_version, event_time,
			                        recipient, subject, body, state, attempts, created_at)
			SELECT 'k' || g, md5('e' || g)::uuid, '<k' || g || '>', md5('o' || g)::uuid, 'order.placed', 1, now(),
			       'a@example.com', 's', 'b', 'sent', 1, now() - interval '40 days' + g * interval '1 ms'
			FROM generate_series($1::int, $2::int) g`, from, to)
		require.NoError(t, err)
	}
	_, err := db.Pool.Exec(ctx, `ALTER TABLE email_send SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	load(1, 40_000)
	_, err = db.Pool.Exec(ctx, `ANALYZE email_send`)
	require.NoError(t, err)

	rec := &pgtest.Recorder{}
	n, err := CleanupLedger(ctx, pgtest.TracedPool(t, db.URL, rec), 30*24*time.Hour, 1000, 0)
	require.NoError(t, err)
	require.EqualValues(t, 40_000, n)
	var setting pgtest.Query
	var batches []pgtest.Query
	for _, q := range rec.Take() {
		switch {
		case q.SQL == preferIndexOrder:
			setting = q
		case strings.Contains(q.SQL, "DELETE FROM email_send"):
			batches = append(batches, q)
		}
	}
	require.Len(t, batches, 41, "forty full batches, then one that finds nothing")
	cursor := func(q pgtest.Query) (at time.Time, key string) {
		for _, a := range q.Args {
			switch v := a.(type) {
			case time.Time:
				at = v
			case string:
				key = v
			}
		}
		return at, key
	}
	prev, _ := cursor(batches[0])
	for _, b := range batches[1:] {
		at, _ := cursor(b)
		require.True(t, at.After(prev), "each batch starts past the one before it: %s, then %s", prev, at)
		prev = at
	}
	_, key := cursor(batches[40])
	require.Equal(t, "k40000", key, "the last batch starts at the backlog's last email")

	load(40_001, 40_100)
	final := batches[40]
	fromStart := pgtest.FromTheStart(final)
	const index = "email_send_finished_cleanup_idx"
	plan := pgtest.Explain(t, db.Pool, setting, final)
	t.Logf("from the cursor, %d blocks:\n%s", plan.IndexBlocks(index), plan)
	zero := pgtest.Explain(t, db.Pool, setting, fromStart)
	t.Logf("from the start, %d blocks:\n%s", zero.IndexBlocks(index), zero)
	require.LessOrEqual(t, plan.IndexBlocks(index), int64(30), "the batch after 40,000 deleted emails walks them")
	require.GreaterOrEqual(t, zero.IndexBlocks(index), int64(150), "the walk from the start should cross the deleted emails' entries")
}
