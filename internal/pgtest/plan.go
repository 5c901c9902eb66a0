package pgtest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Recorder is a pgx query tracer that keeps the statements a connection
// runs, so a test can look at their plans (RowsRead). Set it as
// ConnConfig.Tracer of a pool made for the purpose (TracedPool).
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

// RowsRead runs q under EXPLAIN ANALYZE in a transaction that is rolled
// back, and adds up the rows that the scans of the named tables touched:
// those they returned and those their filters threw away, over all loops.
// That is what a statement costs as its tables grow: a sequential scan, or
// an index scan bounded by a filter rather than an index condition, reads
// them whole. It returns the sum and the plan as text, for messages.
func RowsRead(t testing.TB, pool *pgxpool.Pool, q Query, tables ...string) (int64, string) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatalf("pgtest: begin: %v", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var raw []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+q.SQL, q.Args...).Scan(&raw); err != nil {
		t.Fatalf("pgtest: explain %s: %v", firstLine(q.SQL), err)
	}
	var doc []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || len(doc) == 0 {
		t.Fatalf("pgtest: read plan of %s: %v", firstLine(q.SQL), err)
	}
	watched := map[string]bool{}
	for _, tb := range tables {
		watched[tb] = true
	}
	var sum int64
	var text strings.Builder
	var walk func(n planNode, depth int)
	walk = func(n planNode, depth int) {
		fmt.Fprintf(&text, "%s%s %s %s (rows %d, removed by filter %d, loops %d)\n", strings.Repeat("  ", depth),
			n.Type, n.Relation, n.Index, n.ActualRows, n.RemovedByFilter, n.Loops)
		if watched[n.Relation] && strings.Contains(n.Type, "Scan") {
			sum += (n.ActualRows + n.RemovedByFilter) * max(n.Loops, 1)
		}
		for _, c := range n.Plans {
			walk(c, depth+1)
		}
	}
	walk(doc[0].Plan, 1)
	return sum, firstLine(q.SQL) + "\n" + text.String()
}

type planNode struct {
	Type            string     `json:"Node Type"`
	Relation        string     `json:"Relation Name"`
	Index           string     `json:"Index Name"`
	ActualRows      int64      `json:"Actual Rows"`
	Loops           int64      `json:"Actual Loops"`
	RemovedByFilter int64      `json:"Rows Removed by Filter"`
	Plans           []planNode `json:"Plans"`
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
