package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
	insertPending(t, db, 40000)
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

// TestConfirmPlansForTheTableAsItIs: the confirm, the release of a batch
// the broker refused, and the settle of a batch of shadow rows must find
// their rows by primary key however many rows are pending and whatever the
// planner was told about them. A plan that walks the pending rows instead
// costs O(pending) per batch: under a burst each confirm gets slower as the
// backlog grows, and the backlog grows as the confirms slow down. Each case
// runs the three statements ten times on one connection (pgx prepares them
// once; PostgreSQL may then keep a generic plan), with the table analysed
// while it was empty or while it held only delivered rows; the table then
// takes 20,000 pending rows, and each statement on ten of them may read
// only a few rows of it (pg_stat_xact_user_tables, counted inside the
// statement's transaction).
func TestConfirmPlansForTheTableAsItIs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		session   string // the connection's plan_cache_mode
		delivered int    // delivered rows in the table when it is analysed
	}{
		{name: "generic plans, analysed empty", session: "force_generic_plan"},
		{name: "analysed empty", session: "auto"},
		{name: "analysed with none pending", session: "auto", delivered: 20000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			session := tc.session
			db := newTestDB(t)
			ctx := context.Background()
			outboxtest.AnalyseDelivered(t, db, tc.delivered)
			cfg, err := pgxpool.ParseConfig(db.URL)
			require.NoError(t, err)
			cfg.MaxConns = 1 // one connection: the last confirm runs the statement the first ones prepared
			cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = session
			cfg.AfterConnect = db.Pool.Config().AfterConnect
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)

			owned, err := outboxdb.New(pool).RelayPartitionsAcquire(ctx, outboxdb.RelayPartitionsAcquireParams{
				Owner: "relay-1", LeaseSeconds: 60, MaxPartitions: 1 << 20})
			require.NoError(t, err)
			fence := outboxdb.OutboxConfirmParams{Owner: "relay-1"}
			for _, p := range owned {
				fence.FencePartitions = append(fence.FencePartitions, p.Partition)
				fence.FenceEpochs = append(fence.FenceEpochs, p.Epoch)
			}
			confirm := func(db outboxdb.Batcher, ids []uuid.UUID) []uuid.UUID {
				t.Helper()
				p := fence
				p.EventIDs = ids
				for i := range ids {
					p.Partitions, p.Offsets = append(p.Partitions, 0), append(p.Offsets, int64(i))
				}
				done, err := outboxdb.OutboxConfirmRelaxed(ctx, db, p)
				require.NoError(t, err)
				return done
			}
			release := func(db outboxdb.Batcher, ids []uuid.UUID) []uuid.UUID {
				t.Helper()
				p := outboxdb.OutboxReleaseParams{EventIDs: ids, FencePartitions: fence.FencePartitions,
					FenceEpochs: fence.FenceEpochs, Owner: fence.Owner}
				for range ids {
					p.States = append(p.States, "pending")
					p.ErrorClasses = append(p.ErrorClasses, "transient")
					p.ErrorTexts = append(p.ErrorTexts, "broker away")
					p.DelaysSeconds = append(p.DelaysSeconds, 1)
				}
				done, err := outboxdb.OutboxReleaseCustomPlan(ctx, db, p)
				require.NoError(t, err)
				return done
			}
			settle := func(db outboxdb.Batcher, ids []uuid.UUID) []uuid.UUID {
				t.Helper()
				p := outboxdb.ShadowSettleParams{EventIDs: ids, FencePartitions: fence.FencePartitions,
					FenceEpochs: fence.FenceEpochs, Owner: fence.Owner}
				for range ids {
					p.EventTypes = append(p.EventTypes, "thing.happened")
					p.Results = append(p.Results, "match")
					p.Details = append(p.Details, "")
				}
				done, err := outboxdb.ShadowSettleCustomPlan(ctx, db, p)
				require.NoError(t, err)
				return done
			}
			for range 10 {
				require.Empty(t, confirm(pool, []uuid.UUID{uuid.New(), uuid.New()}))
				require.Empty(t, release(pool, []uuid.UUID{uuid.New(), uuid.New()}))
				require.Empty(t, settle(pool, []uuid.UUID{uuid.New(), uuid.New()}))
			}

			insertPending(t, db, 20000)
			var ids []uuid.UUID
			rows, err := db.Pool.Query(ctx, `SELECT event_id FROM outbox WHERE state = 'pending' ORDER BY next_attempt_at LIMIT 30`)
			require.NoError(t, err)
			ids, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
			require.NoError(t, err)

			for _, st := range []struct {
				name string
				run  func(outboxdb.Batcher, []uuid.UUID) []uuid.UUID
				ids  []uuid.UUID
			}{{"confirm", confirm, ids[:10]}, {"release", release, ids[10:20]}, {"shadow settle", settle, ids[20:]}} {
				var read int64
				require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					stats := func() (n int64) {
						require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(sum(seq_tup_read + idx_tup_fetch), 0)
							FROM pg_stat_xact_user_tables WHERE relname = 'outbox'`).Scan(&n))
						return n
					}
					before := stats()
					require.Len(t, st.run(tx, st.ids), len(st.ids))
					read = stats() - before
					return nil
				}))
				t.Logf("rows of outbox the %s of %d read: %d", st.name, len(st.ids), read)
				require.LessOrEqual(t, read, int64(100), "the %s of %d rows read %d rows of outbox: it walks the pending rows", st.name, len(st.ids), read)
			}
		})
	}
}

// insertPending commits n pending first versions of n aggregates, due one
// millisecond apart from an hour ago.
func insertPending(t *testing.T, db *outboxtest.DB, n int) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `
		INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload,
		                    created_at, next_attempt_at)
		SELECT md5('e' || g)::uuid, 'thing', 'a' || g, 1, 'thing.happened', 1, '{}',
		       now() - interval '1 hour' + g * interval '1 ms', now() - interval '1 hour' + g * interval '1 ms'
		FROM generate_series(1, $1::integer) AS g`, n)
	require.NoError(t, err)
}

// TestBlockedGaugeReadsTheParkedRows: the metrics collector counts, at
// each refresh, the aggregates a parked event holds back
// (OutboxBlockedAggregates). It starts from the parked rows, which it
// reads from outbox_parked_idx, and looks up each one's later versions; it
// must not walk the backlog, which is largest exactly when the gauge
// matters. Here the statistics were taken with only delivered rows; then
// 20,000 events became pending and 10 aggregates have a parked first
// version and a pending second one.
func TestBlockedGaugeReadsTheParkedRows(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	outboxtest.AnalyseDelivered(t, db, 20000)
	insertPending(t, db, 20000)
	_, err := db.Pool.Exec(context.Background(), `
		INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload,
		                    created_at, next_attempt_at, state)
		SELECT md5('p' || g || '-' || v)::uuid, 'thing', 'p' || g, v, 'thing.happened', 1, '{}',
		       now() - interval '2 hours', now() - interval '2 hours', CASE WHEN v = 1 THEN 'parked' ELSE 'pending' END
		FROM generate_series(1, 10) AS g, generate_series(1, 2) AS v`)
	require.NoError(t, err)
	plan := outboxtest.ExplainGenerated(t, db, "", func(ctx context.Context, tx pgx.Tx) {
		rows, err := outboxdb.New(tx).OutboxBlockedAggregates(ctx, []string{})
		require.NoError(t, err)
		require.Equal(t, []outboxdb.OutboxBlockedAggregatesRow{{EventType: "thing.happened", Blocked: 10}}, rows)
	})
	t.Log(plan)
	require.LessOrEqual(t, plan.RowsRead("outbox"), int64(100), "walks the pending rows:\n%s", plan)
}
