package outboxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// The plan tests' kit: a backlog the planner has no statistics for, and
// the plan a generated query runs with on it. The relay's claim (package
// outbox's tests) and the retention cleanup (package operate's) are each
// checked with it, next to the queries they own.

// LoadBacklog fills db with the backlog the plan tests run their queries
// on. The tables are analysed while empty (as before an outage, with
// autovacuum kept from refreshing them), then loaded: 50,000 pending
// events of 10,000 aggregates behind 100 in flight, 2,000 parked, 20,000
// delivered, 20,000 lines of the direct path's log. The planner's
// statistics therefore say the tables are empty, which is when a plan that
// reads everything and sorts it looks as cheap as one that reads a batch.
func LoadBacklog(t testing.TB, db *DB) {
	t.Helper()
	ctx := context.Background()
	for _, tb := range []string{"outbox", "outbox_direct_log"} {
		_, err := db.Pool.Exec(ctx, "ALTER TABLE "+tb+" SET (autovacuum_enabled = false); ANALYZE "+tb)
		require.NoError(t, err)
	}
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload,
		                    created_at, next_attempt_at, state, lease_owner, lease_token, lease_expires_at, delivered_at, attempts)
		SELECT md5('e' || g)::uuid, 'thing', 'a' || (g % 10000), g / 10000 + 1, 'thing.happened', 1, '{}',
		       now() + s.age + g * interval '1 ms', now() + s.age + g * interval '1 ms', s.state,
		       CASE WHEN s.leased THEN 'other-relay' END, CASE WHEN s.leased THEN md5('t' || g)::uuid END,
		       CASE WHEN s.leased THEN now() + interval '30 seconds' END,
		       CASE WHEN s.state = 'delivered' THEN now() + s.age + g * interval '1 ms' END,
		       CASE WHEN s.state = 'parked' THEN 10 ELSE 0 END
		FROM generate_series(0, 72099) g
		CROSS JOIN LATERAL (SELECT * FROM (VALUES
		    -- due, oldest first: each aggregate's versions 1 to 5, spread out in time
		    (49999, 'pending',   false, interval '-1 hour'),
		    -- older, parked for an operator
		    (51999, 'parked',    false, interval '-3 hours'),
		    -- older still: delivered, past the retention, then within it
		    (56999, 'delivered', false, interval '-40 days'),
		    (71999, 'delivered', false, interval '-1 day'),
		    -- in flight, leased by another relay
		    (72099, 'pending',   true,  interval '-2 hours')
		) v(upto, state, leased, age) WHERE g <= v.upto ORDER BY v.upto LIMIT 1) s;
		INSERT INTO outbox_direct_log (event_id, event_type, publish_mode, sent_at)
		SELECT md5('d' || g)::uuid, 'thing.happened', 'direct', now() - interval '40 days' + g * interval '1 minute'
		FROM generate_series(1, 20000) g;`)
	require.NoError(t, err)

}

// AnalyseDelivered turns autovacuum off for outbox, fills it with n
// delivered rows of two hours ago and analyses it: statistics that say
// nothing is pending or parked, as after a relay caught up. The tests of
// the statements that look rows up by id then add the rows they update
// and check that those statements do not walk them.
func AnalyseDelivered(t testing.TB, db *DB, n int) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `ALTER TABLE outbox SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload,
		                    created_at, next_attempt_at, state, delivered_at)
		SELECT md5('d' || g)::uuid, 'thing', 'd' || g, 1, 'thing.happened', 1, '{}',
		       now() - interval '2 hours', now() - interval '2 hours', 'delivered', now() - interval '2 hours'
		FROM generate_series(1, $1::integer) AS g`, n)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `ANALYZE outbox`)
	require.NoError(t, err)
}

// ExplainGenerated runs fn, which calls one generated query, in a
// transaction that is rolled back, with the statement recorded as the
// driver sent it; then runs that statement again under EXPLAIN ANALYZE,
// rolled back too. The plan checked is that of the query as written today.
func ExplainGenerated(t testing.TB, db *DB, settings string, fn func(ctx context.Context, tx pgx.Tx)) Plan {
	t.Helper()
	ctx := context.Background()
	rec := &statementRecorder{}
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = rec
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer traced.Close()
	func() {
		tx, err := traced.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		rec.take()
		fn(ctx, tx)
	}()
	stmts := rec.take()
	require.Len(t, stmts, 2, "the statement and the rollback")
	q := stmts[0]

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	if settings != "" {
		_, err := tx.Exec(ctx, settings)
		require.NoError(t, err)
	}
	var raw []byte
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+q.sql, q.args...).Scan(&raw))
	var doc []struct {
		Plan planNode `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	name, _, _ := strings.Cut(q.sql, "\n")
	return Plan{sql: name, root: doc[0].Plan}
}

type statementRecorder struct {
	mu    sync.Mutex
	stmts []recordedStatement
}

type recordedStatement struct {
	sql  string
	args []any
}

func (r *statementRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stmts = append(r.stmts, recordedStatement{sql: d.SQL, args: d.Args})
	return ctx
}

func (r *statementRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *statementRecorder) take() []recordedStatement {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stmts
	r.stmts = nil
	return s
}

// Plan is the plan PostgreSQL ran a statement with, as EXPLAIN (ANALYZE)
// reported it.
type Plan struct {
	sql  string
	root planNode
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

func (p Plan) walk(fn func(n planNode, depth int)) {
	var rec func(n planNode, depth int)
	rec = func(n planNode, depth int) {
		fn(n, depth)
		for _, c := range n.Plans {
			rec(c, depth+1)
		}
	}
	rec(p.root, 0)
}

// RowsRead adds up the rows the scans of the named tables touched,
// returned or filtered out, over all loops.
func (p Plan) RowsRead(tables ...string) int64 {
	var sum int64
	p.walk(func(n planNode, _ int) {
		for _, tb := range tables {
			if n.Relation == tb && strings.Contains(n.Type, "Scan") {
				sum += (n.ActualRows + n.RemovedByFilter) * max(n.Loops, 1)
			}
		}
	})
	return sum
}

// IndexBlocks is how many blocks the plan's scans of the named index
// touched, in the buffer cache or read into it: the index's own pages and
// the table's pages they fetched rows from.
func (p Plan) IndexBlocks(index string) int64 {
	var sum int64
	p.walk(func(n planNode, _ int) {
		if n.Index == index {
			sum += n.SharedHit + n.SharedRead
		}
	})
	return sum
}

// SortedRows is the most rows any Sort or Incremental Sort node took in.
func (p Plan) SortedRows() int64 {
	var most int64
	p.walk(func(n planNode, _ int) {
		if n.Type == "Sort" || n.Type == "Incremental Sort" {
			var in int64
			for _, c := range n.Plans {
				in += c.ActualRows * max(c.Loops, 1)
			}
			most = max(most, in)
		}
	})
	return most
}

// String shows the plan's tree, one node a line.
func (p Plan) String() string {
	var b strings.Builder
	b.WriteString(p.sql + "\n")
	p.walk(func(n planNode, depth int) {
		fmt.Fprintf(&b, "%s%s %s %s (rows %d, removed by filter %d, loops %d)\n", strings.Repeat("  ", depth+1),
			n.Type, n.Relation, n.Index, n.ActualRows, n.RemovedByFilter, n.Loops)
	})
	return b.String()
}
