package pgtest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Recorder is a pgx query and batch tracer that keeps the statements a
// connection runs, in order, so a test can look at their plans (Explain,
// RowsRead). Set it as ConnConfig.Tracer of a pool made for the purpose
// (TracedPool).
type Recorder struct {
	mu      sync.Mutex
	queries []Query
}

// Query is one statement a Recorder saw, with its arguments.
type Query struct {
	SQL  string
	Args []any
}

// TraceQueryStart records the statement.
func (r *Recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queries = append(r.queries, Query{SQL: d.SQL, Args: d.Args})
	return ctx
}

// TraceQueryEnd does nothing.
func (r *Recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart does nothing: the batch's statements are recorded one by
// one as their results are read.
func (r *Recorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery records one statement of a batch.
func (r *Recorder) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queries = append(r.queries, Query{SQL: d.SQL, Args: d.Args})
}

// TraceBatchEnd does nothing.
func (r *Recorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// Take returns the statements recorded since the last Take.
func (r *Recorder) Take() []Query {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.queries
	r.queries = nil
	return q
}

// TracedPool returns a pool on url whose statements rec records, closed
// when the test ends.
func TracedPool(t testing.TB, url string, rec *Recorder) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", url, err)
	}
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: traced pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Capture runs fn in a transaction on url that is rolled back afterwards,
// and returns the statements fn ran, text and arguments as the driver sent
// them. A test calls a generated query method in fn, so the plan it checks
// (Explain) is always that of the query as it is written today, not of a
// copy in the test. fn's errors (pgx.ErrNoRows, say) are fn's to judge.
func Capture(t testing.TB, url string, fn func(ctx context.Context, tx pgx.Tx)) []Query {
	t.Helper()
	rec := &Recorder{}
	pool := TracedPool(t, url, rec)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatalf("pgtest: begin: %v", err)
	}
	// Deferred: fn may end the test (require), and the pool's cleanup
	// waits for the transaction's connection.
	defer func() { _ = tx.Rollback(ctx) }()
	rec.Take() // BEGIN
	fn(ctx, tx)
	queries := rec.Take()
	if len(queries) == 0 {
		t.Fatalf("pgtest: Capture: fn ran no statement")
	}
	return queries
}

// FromTheStart returns q, a batch of a keyset cleanup, with its cursor
// moved before every row: each time argument set to year 1 and each text
// argument emptied. Only a statement whose time and text arguments are all
// its cursor can be moved this way.
func FromTheStart(q Query) Query {
	first := Query{SQL: q.SQL, Args: slices.Clone(q.Args)}
	for i, a := range first.Args {
		switch a.(type) {
		case time.Time:
			first.Args[i] = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
		case string:
			first.Args[i] = ""
		}
	}
	return first
}

// FreezeStats takes the planner's statistics of the tables now (ANALYZE)
// and turns autovacuum off for them, so that they stay as they are while
// the test loads data. Called on empty tables, it reproduces the state of
// a database at the start of an outage's recovery: statistics from before
// a burst, a backlog the planner knows nothing about. A plan that is only
// good because the statistics happen to be fresh shows up as bad here.
func FreezeStats(t testing.TB, pool *pgxpool.Pool, tables ...string) {
	t.Helper()
	ctx := context.Background()
	for _, tb := range tables {
		name := pgx.Identifier{tb}.Sanitize()
		if _, err := pool.Exec(ctx, "ALTER TABLE "+name+" SET (autovacuum_enabled = false)"); err != nil {
			t.Fatalf("pgtest: turn autovacuum off for %s: %v", tb, err)
		}
		if _, err := pool.Exec(ctx, "ANALYZE "+name); err != nil {
			t.Fatalf("pgtest: analyze %s: %v", tb, err)
		}
	}
}

// Plan is what EXPLAIN ANALYZE reported for one statement.
type Plan struct {
	// SQL is the statement's first line, for messages.
	SQL  string
	Root PlanNode
}

// PlanNode is one node of a plan, with the actual figures of its run.
type PlanNode struct {
	Type            string     `json:"Node Type"`
	Relation        string     `json:"Relation Name"`
	Index           string     `json:"Index Name"`
	ActualRows      int64      `json:"Actual Rows"`
	Loops           int64      `json:"Actual Loops"`
	RemovedByFilter int64      `json:"Rows Removed by Filter"`
	SharedHit       int64      `json:"Shared Hit Blocks"`
	SharedRead      int64      `json:"Shared Read Blocks"`
	Plans           []PlanNode `json:"Plans"`
}

// rows is what the node produced over all its loops.
func (n PlanNode) rows() int64 { return n.ActualRows * max(n.Loops, 1) }

// Explain runs every statement but the last as it is, then the last under
// EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON), all in one transaction that is rolled
// back, and returns the last one's plan with what each node did. Settings
// the earlier statements made for their transaction (set_config(..., true))
// thus apply as they did when the statements ran (Capture), and a claim or
// a delete can be measured without changing anything.
func Explain(t testing.TB, pool *pgxpool.Pool, statements ...Query) Plan {
	t.Helper()
	if len(statements) == 0 {
		t.Fatalf("pgtest: Explain: no statement")
	}
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatalf("pgtest: begin: %v", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	q := statements[len(statements)-1]
	for _, before := range statements[:len(statements)-1] {
		if _, err := tx.Exec(ctx, before.SQL, before.Args...); err != nil {
			t.Fatalf("pgtest: run %s: %v", firstLine(before.SQL), err)
		}
	}
	var raw []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+q.SQL, q.Args...).Scan(&raw); err != nil {
		t.Fatalf("pgtest: explain %s: %v", firstLine(q.SQL), err)
	}
	var doc []struct {
		Plan PlanNode `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || len(doc) == 0 {
		t.Fatalf("pgtest: read plan of %s: %v", firstLine(q.SQL), err)
	}
	return Plan{SQL: firstLine(q.SQL), Root: doc[0].Plan}
}

// IndexBlocks is how many blocks the plan's scans of the named index
// touched, in the buffer cache or read into it: the index's own pages and
// the table's pages they fetched rows from.
func (p Plan) IndexBlocks(index string) int64 {
	var sum int64
	p.walk(func(n PlanNode, _ int) {
		if n.Index == index {
			sum += n.SharedHit + n.SharedRead
		}
	})
	return sum
}

// RowsRead adds up the rows that the plan's scans of the named tables
// touched: those they returned and those their filters threw away, over
// all loops. That is what a statement costs as its tables grow: a
// sequential scan, or an index scan bounded by a filter rather than an
// index condition, reads them whole.
func (p Plan) RowsRead(tables ...string) int64 {
	watched := map[string]bool{}
	for _, tb := range tables {
		watched[tb] = true
	}
	var sum int64
	p.walk(func(n PlanNode, _ int) {
		if watched[n.Relation] && strings.Contains(n.Type, "Scan") {
			sum += (n.ActualRows + n.RemovedByFilter) * max(n.Loops, 1)
		}
	})
	return sum
}

// SortedRows is the largest number of rows any Sort or Incremental Sort
// node of the plan took in. A statement whose order an index gives sorts
// nothing, or only the few rows its branches picked; one that sorts its
// candidates reads and sorts the whole backlog to return the first row.
func (p Plan) SortedRows() int64 {
	var most int64
	p.walk(func(n PlanNode, _ int) {
		if n.Type != "Sort" && n.Type != "Incremental Sort" {
			return
		}
		var in int64
		for _, c := range n.Plans {
			in += c.rows()
		}
		most = max(most, in)
	})
	return most
}

// String is the plan as an indented list of nodes with their figures, for
// failure messages.
func (p Plan) String() string {
	var b strings.Builder
	b.WriteString(p.SQL + "\n")
	p.walk(func(n PlanNode, depth int) {
		fmt.Fprintf(&b, "%s%s %s %s (rows %d, removed by filter %d, loops %d)\n", strings.Repeat("  ", depth+1),
			n.Type, n.Relation, n.Index, n.ActualRows, n.RemovedByFilter, n.Loops)
	})
	return b.String()
}

func (p Plan) walk(fn func(n PlanNode, depth int)) {
	var rec func(n PlanNode, depth int)
	rec = func(n PlanNode, depth int) {
		fn(n, depth)
		for _, c := range n.Plans {
			rec(c, depth+1)
		}
	}
	rec(p.Root, 0)
}

// RowsRead runs q under EXPLAIN ANALYZE (Explain) and returns the rows its
// scans of the named tables touched (Plan.RowsRead) and the plan as text.
func RowsRead(t testing.TB, pool *pgxpool.Pool, q Query, tables ...string) (int64, string) {
	t.Helper()
	p := Explain(t, pool, q)
	return p.RowsRead(tables...), p.String()
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
