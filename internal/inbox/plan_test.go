package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/inbox"
)

// TestMaintenanceReadsLittle: the gauge refresh (every few seconds) and the
// cleanup (every hour, on one instance) read the rows they are about, not
// the tables. With 100,000 aggregates, 100,000 processed events and a long
// resolved history of parked records, each statement they run is
// re-run under EXPLAIN ANALYZE and the rows its scans of those tables
// touch (returned plus filtered out) must stay small. A sequential scan, or
// an index scan whose bound is a filter instead of an index condition (a
// volatile clock_timestamp() in the cutoff), reads them all and fails.
func TestMaintenanceReadsLittle(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO inbox_aggregate (aggregate_type, aggregate_id, last_version, gap_since, resync_after)
		SELECT 'thing', g::text, 3,
		       CASE WHEN g % 5000 = 0 THEN now() - interval '1 hour' END,
		       CASE WHEN g % 5000 = 0 THEN now() + interval '1 hour' END
		FROM generate_series(1, 100000) g;
		INSERT INTO processed_event (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, outcome, processed_at)
		SELECT gen_random_uuid(), 'thing', (g % 25000)::text, g / 25000 + 1, 'thing.step', 'applied', now() - (g || ' seconds')::interval
		FROM generate_series(1, 100000) g;
		INSERT INTO inbox_parked_record (source, partition, "offset", park_key, record_sha256, record_key, record_value, reason,
		                                 resolution, resolved_by, resolved_at)
		SELECT 't', 0, g, 'position:t/0@' || g, sha256(g::text::bytea), 'k', '{}', 'undecodable',
		       CASE WHEN g > 50 THEN 'applied' END, CASE WHEN g > 50 THEN 'ops' END, CASE WHEN g > 50 THEN now() END
		FROM generate_series(1, 20000) g;
		ANALYZE inbox_aggregate; ANALYZE processed_event; ANALYZE inbox_parked_record;`)
	require.NoError(t, err)

	rec := &queryRecorder{}
	traced := tracedPool(t, db.URL, rec)
	ib, err := inbox.New(inbox.Config{Pool: traced, GapWindow: 30 * time.Second,
		Apply: func(context.Context, pgx.Tx, inbox.Event) error { return nil }})
	require.NoError(t, err)

	st, err := ib.RefreshStats(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.Stats{GapsOverdue: 20, ParkedRecords: 50}, st, "resolved parked records are history, not counted")
	n, err := ib.Cleanup(ctx, 30*24*time.Hour, 1000, 0)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is older than the TTL")

	big := []string{"inbox_aggregate", "processed_event", "inbox_parked_record"}
	queries := rec.take()
	require.GreaterOrEqual(t, len(queries), 4, "the refresh's three counts and the cleanup's batch")
	for _, q := range queries {
		if strings.Contains(q.sql, "advisory") || strings.Contains(q.sql, "set_config") || strings.HasPrefix(q.sql, "RESET") {
			continue // the cleanup's lock and session settings: no table
		}
		plan := explain(t, db.Pool, q)
		read := plan.rowsRead(big...)
		t.Logf("%s\n%s", firstLine(q.sql), plan)
		require.LessOrEqual(t, read, int64(1000), "%s reads %d rows of %v; plan:\n%s", firstLine(q.sql), read, big, plan)
	}
}

// queryRecorder is a pgx tracer that keeps the statements a pool runs.
type queryRecorder struct {
	mu      sync.Mutex
	queries []recordedQuery
}

type recordedQuery struct {
	sql  string
	args []any
}

func (r *queryRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queries = append(r.queries, recordedQuery{sql: d.SQL, args: d.Args})
	return ctx
}

func (r *queryRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *queryRecorder) take() []recordedQuery {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.queries
	r.queries = nil
	return q
}

// tracedPool returns a pool on url whose statements rec records, closed
// when the test ends.
func tracedPool(t *testing.T, url string, rec *queryRecorder) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

type planNode struct {
	Type            string     `json:"Node Type"`
	Relation        string     `json:"Relation Name"`
	Index           string     `json:"Index Name"`
	ActualRows      int64      `json:"Actual Rows"`
	Loops           int64      `json:"Actual Loops"`
	RemovedByFilter int64      `json:"Rows Removed by Filter"`
	SharedHit       int64      `json:"Shared Hit Blocks"`
	SharedRead      int64      `json:"Shared Read Blocks"`
	Plans           []planNode `json:"Plans"`
}

// explain runs the last of qs under EXPLAIN (ANALYZE, BUFFERS), after the
// settings the ones before it made (what its code sends first), in a
// transaction that is rolled back, and returns the plan with what each
// node did.
func explain(t *testing.T, pool *pgxpool.Pool, qs ...recordedQuery) queryPlan {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	for _, q := range qs[:len(qs)-1] {
		if strings.Contains(q.sql, "set_config") {
			_, err := tx.Exec(ctx, strings.ReplaceAll(q.sql, ", false)", ", true)"), q.args...)
			require.NoError(t, err)
		}
	}
	q := qs[len(qs)-1]
	var raw []byte
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+q.sql, q.args...).Scan(&raw))
	var doc []struct {
		Plan planNode `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	return queryPlan{root: doc[0].Plan}
}

// queryPlan is a statement's plan as EXPLAIN ANALYZE returned it.
type queryPlan struct{ root planNode }

func (p queryPlan) walk(fn func(n planNode, depth int)) {
	var walk func(n planNode, depth int)
	walk = func(n planNode, depth int) {
		fn(n, depth)
		for _, c := range n.Plans {
			walk(c, depth+1)
		}
	}
	walk(p.root, 1)
}

// rowsRead adds up the rows that the scans of the named tables touched:
// those they returned and those their filters threw away, over all loops.
func (p queryPlan) rowsRead(tables ...string) (sum int64) {
	p.walk(func(n planNode, _ int) {
		if slices.Contains(tables, n.Relation) && strings.Contains(n.Type, "Scan") {
			sum += (n.ActualRows + n.RemovedByFilter) * max(n.Loops, 1)
		}
	})
	return sum
}

// sorted is the most rows any sort took in.
func (p queryPlan) sorted() (most int64) {
	p.walk(func(n planNode, _ int) {
		if strings.Contains(n.Type, "Sort") {
			for _, c := range n.Plans {
				most = max(most, c.ActualRows*max(c.Loops, 1))
			}
		}
	})
	return most
}

// indexBlocks is how many blocks the scans of index touched: the index's
// pages and the table's pages they fetched rows from. Dead entries cost
// blocks even though no row comes of them, which rows read cannot show.
func (p queryPlan) indexBlocks(index string) (sum int64) {
	p.walk(func(n planNode, _ int) {
		if n.Index == index {
			sum += n.SharedHit + n.SharedRead
		}
	})
	return sum
}

// String is the plan as an indented list of nodes, for failure messages.
func (p queryPlan) String() string {
	var b strings.Builder
	p.walk(func(n planNode, depth int) {
		fmt.Fprintf(&b, "%s%s %s %s (rows %d, removed by filter %d, blocks %d)\n", strings.Repeat("  ", depth),
			n.Type, n.Relation, n.Index, n.ActualRows, n.RemovedByFilter, n.SharedHit+n.SharedRead)
	})
	return b.String()
}

// fromTheStart is a cleanup batch q with its cursor (the time and the
// event id of the last marker deleted before it) set before every marker.
func fromTheStart(q recordedQuery) recordedQuery {
	first := recordedQuery{sql: q.sql, args: slices.Clone(q.args)}
	for i, a := range first.args {
		switch a.(type) {
		case time.Time:
			first.args[i] = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
		case uuid.UUID:
			first.args[i] = uuid.Nil
		}
	}
	return first
}

// TestCleanupSeeksPastWhatItDeleted: a deleted marker's entry stays in
// processed_event_cleanup_idx until the table is vacuumed, so a cleanup
// whose every batch walked the index from its start would step over all
// the batches before it: time quadratic in the backlog. Each batch starts
// past the last marker the one before it deleted. Here a run deletes
// 40,000 expired markers in batches of 1,000 with autovacuum off: every
// batch's cursor is past the one before, and the last is the backlog's
// last marker. Then 100 more expire, and the run's final statement, run
// again, touches a handful of the index's blocks from its cursor, against
// hundreds from the start of the index.
func TestCleanupSeeksPastWhatItDeleted(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := context.Background()
	load := func(from, to int) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, `
			INSERT INTO processed_event (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, outcome, processed_at)
			SELECT gen_random_uuid(), 'thing', g::text, 1, 'thing.step', 'applied',
			       now() - interval '40 days' + g * interval '1 ms'
			FROM generate_series($1::int, $2::int) g`, from, to)
		require.NoError(t, err)
	}
	_, err := db.Pool.Exec(ctx, `ALTER TABLE processed_event SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	load(1, 40_000)
	_, err = db.Pool.Exec(ctx, `ANALYZE processed_event`)
	require.NoError(t, err)
	var lastAt time.Time
	var lastID uuid.UUID
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT processed_at, event_id FROM processed_event
		ORDER BY processed_at DESC, event_id DESC LIMIT 1`).Scan(&lastAt, &lastID))

	rec := &queryRecorder{}
	traced := tracedPool(t, db.URL, rec)
	ib, err := inbox.New(inbox.Config{Pool: traced, GapWindow: 30 * time.Second,
		Apply: func(context.Context, pgx.Tx, inbox.Event) error { return nil }})
	require.NoError(t, err)
	n, err := ib.Cleanup(ctx, 30*24*time.Hour, 1000, 0)
	require.NoError(t, err)
	require.EqualValues(t, 40_000, n)

	var batches []recordedQuery
	for _, q := range rec.take() {
		if strings.Contains(q.sql, "DELETE FROM processed_event") {
			batches = append(batches, q)
		}
	}
	require.Len(t, batches, 41, "forty full batches, then one that finds nothing")
	cursor := func(q recordedQuery) (at time.Time, id uuid.UUID) {
		for _, a := range q.args {
			switch v := a.(type) {
			case time.Time:
				at = v
			case uuid.UUID:
				id = v
			}
		}
		return at, id
	}
	prev, _ := cursor(batches[0])
	for _, b := range batches[1:] {
		at, _ := cursor(b)
		require.True(t, at.After(prev), "each batch starts past the one before it: %s, then %s", prev, at)
		prev = at
	}
	at, id := cursor(batches[40])
	require.True(t, at.Equal(lastAt), "the last batch starts at the backlog's last marker: %s, want %s", at, lastAt)
	require.Equal(t, lastID, id)

	load(40_001, 40_100)
	final := batches[40]
	plan := explain(t, db.Pool, final)
	fromCursor := plan.indexBlocks("processed_event_cleanup_idx")
	t.Logf("from the cursor, %d blocks:\n%s", fromCursor, plan)
	fromStart := fromTheStart(final)
	plan = explain(t, db.Pool, fromStart)
	fromZero := plan.indexBlocks("processed_event_cleanup_idx")
	t.Logf("from the start, %d blocks:\n%s", fromZero, plan)
	require.LessOrEqual(t, fromCursor, int64(30), "the batch after 40,000 deleted markers walks them")
	require.GreaterOrEqual(t, fromZero, int64(150), "the walk from the start should cross the deleted markers' entries")
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// TestHotQueriesOnAStaleBacklog: the resync loop's look for due gaps and
// the TTL cleanup read a batch, in their index's order, on a backlog the
// planner has no statistics for: the tables are analysed while empty (as
// before an outage, with autovacuum kept from refreshing them), then
// loaded with 100,000 aggregates (50 gaps due, 40,000 not yet) and
// 50,000 markers past their TTL. A plan that reads every candidate and
// sorts it to take the first hundred costs O(backlog) per batch, and
// O(backlog²) to work through it.
func TestHotQueriesOnAStaleBacklog(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := context.Background()
	for _, tb := range []string{"inbox_aggregate", "processed_event"} {
		_, err := db.Pool.Exec(ctx, "ALTER TABLE "+tb+" SET (autovacuum_enabled = false); ANALYZE "+tb)
		require.NoError(t, err)
	}
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO inbox_aggregate (aggregate_type, aggregate_id, last_version, gap_since, resync_after)
		SELECT 'thing', g::text, 3,
		       CASE WHEN g % 5 < 2 THEN now() - interval '1 hour' END,
		       CASE WHEN g % 2000 = 0 THEN now() - interval '1 minute' + g * interval '1 ms'
		            WHEN g % 5 < 2 THEN now() + interval '1 hour' + g * interval '1 ms' END
		FROM generate_series(1, 100000) g;`)
	require.NoError(t, err)
	loadMarkers := func() {
		t.Helper()
		_, err := db.Pool.Exec(ctx, `
			INSERT INTO processed_event (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, outcome, processed_at)
			SELECT gen_random_uuid(), 'thing', (g % 25000)::text, g / 25000 + 1, 'thing.step', 'applied',
			       now() - interval '40 days' + g * interval '1 second'
			FROM generate_series(1, 50000) g`)
		require.NoError(t, err)
	}
	loadMarkers()

	rec := &queryRecorder{}
	traced := tracedPool(t, db.URL, rec)
	ib, err := inbox.New(inbox.Config{Pool: traced, GapWindow: 30 * time.Second,
		Apply: func(context.Context, pgx.Tx, inbox.Event) error { return nil },
		Fetch: func(context.Context, string, string) (inbox.Snapshot, error) {
			return inbox.Snapshot{}, fmt.Errorf("the source is away")
		},
		ApplySnapshot: func(context.Context, pgx.Tx, inbox.Snapshot) error { return nil }})
	require.NoError(t, err)

	// find returns the last statement containing marker, after the
	// settings the code sent before it on its way there, if any.
	find := func(qs []recordedQuery, marker string) []recordedQuery {
		t.Helper()
		for i := len(qs) - 1; i >= 0; i-- {
			if strings.Contains(qs[i].sql, marker) {
				for j := i - 1; j >= 0; j-- {
					if strings.Contains(qs[j].sql, "set_config") {
						return []recordedQuery{qs[j], qs[i]}
					}
				}
				return qs[i : i+1]
			}
		}
		require.Failf(t, "statement not run", "%q", marker)
		return nil
	}
	rec.take()
	_, err = ib.ResyncDue(ctx, 100)
	require.NoError(t, err, "a failed fetch is recorded for a later attempt")
	gaps := find(rec.take(), "FROM inbox_aggregate")
	n, err := ib.Cleanup(ctx, 30*24*time.Hour, 1000, 0)
	require.NoError(t, err)
	require.Equal(t, int64(50000), n)
	cleanup := find(rec.take(), "DELETE FROM processed_event")
	loadMarkers() // the plan of a batch is read on a full backlog
	// The run's last statement starts past every marker it deleted; run
	// again from the start of the index, it is the first batch of a new
	// run on the backlog just loaded.
	cleanup[len(cleanup)-1] = fromTheStart(cleanup[len(cleanup)-1])
	for _, c := range []struct {
		name      string
		q         []recordedQuery
		maxSorted int64 // the cleanup sorts the batch it deleted to find its last marker
	}{{"due gaps", gaps, 1}, {"cleanup", cleanup, 1000}} {
		plan := explain(t, db.Pool, c.q...)
		read, sorted := plan.rowsRead("inbox_aggregate", "processed_event"), plan.sorted()
		t.Logf("%s: %s\n%s", c.name, firstLine(c.q[len(c.q)-1].sql), plan)
		require.LessOrEqual(t, sorted, c.maxSorted, "%s sorts the backlog:\n%s", c.name, plan)
		require.LessOrEqual(t, read, int64(2500), "%s reads the backlog:\n%s", c.name, plan)
	}
}

// TestBatchPlansForTheTableAsItIs: ProcessBatch's statements, and the
// caller's in ApplyBatch, read only the batch's rows of a table that has
// grown since they were prepared. pgx prepares each statement once per
// connection, and PostgreSQL may then reuse a generic plan made for the
// table as it was: on a new database an empty table, kept until the table
// is next analysed, which autovacuum does not do before its first visit.
// Such a plan (hash the batch's arrays and read the table, or a sequential
// scan for "= ANY") reads every row for each batch. Two histories: the
// session told to use generic plans (PostgreSQL's own choice after five
// executions when the generic plan looks no costlier) on a never-analysed
// table, and plans made after an ANALYZE of a few dozen rows.
func TestBatchPlansForTheTableAsItIs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		session      string // the connection's plan_cache_mode
		analyseFirst int    // rows in the table, analysed, before the statements are prepared
	}{
		{name: "generic plans, never analysed", session: "force_generic_plan"},
		{name: "analysed while small", session: "auto", analyseFirst: 60},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := newTestDB(t)
			ctx := context.Background()
			_, err := db.Pool.Exec(ctx, `ALTER TABLE inbox_aggregate SET (autovacuum_enabled = false);
				ALTER TABLE processed_event SET (autovacuum_enabled = false)`)
			require.NoError(t, err)
			grow := func(from, n int) {
				t.Helper()
				for _, q := range []string{
					`INSERT INTO inbox_aggregate (aggregate_type, aggregate_id, last_version)
					 SELECT 'thing', 'other-' || g, 1 FROM generate_series($1::int, $2::int) g`,
					`INSERT INTO processed_event (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, outcome)
					 SELECT gen_random_uuid(), 'thing', 'other-' || g, 1, 'thing.step', 'applied' FROM generate_series($1::int, $2::int) g`,
				} {
					_, err := db.Pool.Exec(ctx, q, from, from+n-1)
					require.NoError(t, err)
				}
			}
			if tc.analyseFirst > 0 {
				grow(1, tc.analyseFirst)
				_, err := db.Pool.Exec(ctx, "ANALYZE inbox_aggregate; ANALYZE processed_event")
				require.NoError(t, err)
			}
			cfg, err := pgxpool.ParseConfig(db.URL)
			require.NoError(t, err)
			cfg.MaxConns = 1 // one connection: the last batch runs the statements the first ones prepared
			cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = tc.session
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			ib, err := inbox.New(inbox.Config{Pool: pool, GapWindow: 30 * time.Second,
				Apply: func(context.Context, pgx.Tx, inbox.Event) error { return nil },
				// The caller's own read of the batch, by "= ANY" on a primary key.
				ApplyBatch: func(ctx context.Context, tx pgx.Tx, events []inbox.Event) error {
					ids := make([]uuid.UUID, len(events))
					for i, e := range events {
						ids[i] = e.ID
					}
					var n int
					return tx.QueryRow(ctx, "SELECT count(*) FROM processed_event WHERE event_id = ANY($1::uuid[])", ids).Scan(&n)
				},
				Fetch: func(context.Context, string, string) (inbox.Snapshot, error) {
					return inbox.Snapshot{}, fmt.Errorf("the source is away")
				},
				ApplySnapshot: func(context.Context, pgx.Tx, inbox.Snapshot) error { return nil }})
			require.NoError(t, err)
			batch := func(version int64) (seqRead, fetched int64) {
				t.Helper()
				var events []inbox.Event
				for _, id := range []string{"a1", "a2", "a3"} {
					events = append(events, inbox.Event{ID: uuid.New(), AggregateType: "thing", AggregateID: id,
						AggregateVersion: version, Type: "thing.step", Time: time.Now()})
				}
				// What the batch read of the two tables: the difference of this
				// backend's counters, which also hold earlier transactions'
				// reads until PostgreSQL flushes them.
				read := func(tx pgx.Tx) (seq, idx int64) {
					require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(sum(seq_tup_read), 0), coalesce(sum(idx_tup_fetch), 0)
						FROM pg_stat_xact_user_tables WHERE relname IN ('inbox_aggregate', 'processed_event')`).Scan(&seq, &idx))
					return seq, idx
				}
				require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					seq0, idx0 := read(tx)
					results, err := ib.ProcessBatch(ctx, tx, events)
					if err != nil {
						return err
					}
					for _, r := range results {
						require.Equal(t, inbox.Applied, r.Outcome)
					}
					seq1, idx1 := read(tx)
					seqRead, fetched = seq1-seq0, idx1-idx0
					return nil
				}))
				return seqRead, fetched
			}
			// Prepared on the small table, and run often enough for
			// PostgreSQL to settle on a plan.
			for v := int64(1); v <= 8; v++ {
				batch(v)
			}
			grow(1_000_000, 20_000)
			seqRead, fetched := batch(9)
			t.Logf("a batch of 3 events on 20,000 aggregates: %d rows read by sequential scans, %d fetched by index", seqRead, fetched)
			require.Zero(t, seqRead, "the batch reads whole tables instead of looking up its own rows")
			require.LessOrEqual(t, fetched, int64(30), "the batch fetches rows beyond its own")
		})
	}
}
