package orders

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/orders/ordersdb"
	"github.com/outboxref/orders/internal/pgtest"
)

// TestKeyCleanup: idempotency keys older than the retention go, in
// batches; recent ones stay and still replay; the orders stay.
func TestKeyCleanup(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	for i := range 5 {
		_, _, err := f.svc.Place(ctx, alice, PlaceOrder{Input: newInput(), IdempotencyKey: fmt.Sprintf("old-%d", i)})
		require.NoError(t, err)
	}
	_, err := f.pool.Exec(ctx, "UPDATE idempotency_keys SET created_at = now() - interval '2 days'")
	require.NoError(t, err)
	recent, _, err := f.svc.Place(ctx, alice, PlaceOrder{Input: newInput(), IdempotencyKey: "recent"})
	require.NoError(t, err)

	n, err := NewKeyCleanup(f.pool).Run(ctx, 24*time.Hour, 2, time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, int64(5), n)
	var keys, orders int
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM idempotency_keys), (SELECT count(*) FROM orders)").Scan(&keys, &orders))
	require.Equal(t, 1, keys)
	require.Equal(t, 6, orders, "deleting a key never deletes its order")
	again, replayed, err := f.svc.Place(ctx, alice, PlaceOrder{Input: newInput(), IdempotencyKey: "recent"})
	require.NoError(t, err)
	require.True(t, replayed)
	require.Equal(t, recent.ID, again.ID)

	_, err = NewKeyCleanup(f.pool).Run(ctx, time.Hour, 0, 0)
	require.Error(t, err)
}

// TestKeyCleanupSeeksPastWhatItDeleted: a deleted key's entry stays in
// idempotency_keys_created_idx until the table is vacuumed, so a cleanup
// whose every batch walked the index from its start would step over all
// the batches before it: time quadratic in the backlog. Each batch starts
// past the last key the one before it deleted. A run deletes 40,000 expired
// keys in batches of 1,000 with autovacuum off; then 100 more expire, and
// the run's final statement, run again, touches a handful of the index's
// blocks from its cursor against hundreds from the start.
func TestKeyCleanupSeeksPastWhatItDeleted(t *testing.T) {
	t.Parallel()
	db, load := expiredKeys(t)
	ctx := context.Background()
	load(1, 40_000)
	_, err := db.Pool.Exec(ctx, `ANALYZE idempotency_keys`)
	require.NoError(t, err)

	rec := &pgtest.Recorder{}
	n, err := NewKeyCleanup(pgtest.TracedPool(t, db.URL, rec)).Run(ctx, 30*24*time.Hour, 1000, 0)
	require.NoError(t, err)
	require.EqualValues(t, 40_000, n)
	var batches []pgtest.Query
	for _, q := range rec.Take() {
		if strings.Contains(q.SQL, "DELETE FROM idempotency_keys") {
			batches = append(batches, q)
		}
	}
	require.Len(t, batches, 41, "forty full batches, then one that finds nothing")
	cursor := func(q pgtest.Query) (at time.Time, texts []string) {
		for _, a := range q.Args {
			switch v := a.(type) {
			case time.Time:
				at = v
			case string:
				texts = append(texts, v)
			}
		}
		return at, texts
	}
	prev, _ := cursor(batches[0])
	for _, b := range batches[1:] {
		at, _ := cursor(b)
		require.True(t, at.After(prev), "each batch starts past the one before it: %s, then %s", prev, at)
		prev = at
	}
	_, texts := cursor(batches[40])
	require.Equal(t, []string{"alice", "key-040000"}, texts, "the last batch starts at the backlog's last key")

	load(40_001, 40_100)
	final := batches[40]
	fromStart := pgtest.FromTheStart(final)
	const index = "idempotency_keys_created_idx"
	plan := pgtest.Explain(t, db.Pool, final)
	t.Logf("from the cursor, %d blocks:\n%s", plan.IndexBlocks(index), plan)
	zero := pgtest.Explain(t, db.Pool, fromStart)
	t.Logf("from the start, %d blocks:\n%s", zero.IndexBlocks(index), zero)
	require.LessOrEqual(t, plan.IndexBlocks(index), int64(30), "the batch after 40,000 deleted keys walks them")
	require.GreaterOrEqual(t, zero.IndexBlocks(index), int64(150), "the walk from the start should cross the deleted keys' entries")
}

// TestKeyCleanupReadsOnlyItsBatch: a batch of the cleanup reads the keys
// it deletes and no others, whatever the planner's statistics say. With
// the batch matched to the table by (customer, key), statistics taken
// while the table held 100 keys made the planner hash the batch and read
// all 40,100 keys to find its 1,000: each batch of a run, so a run over a
// backlog took time quadratic in it. The batch is deleted by its rows'
// addresses (ctid), which can only be fetched one by one.
func TestKeyCleanupReadsOnlyItsBatch(t *testing.T) {
	t.Parallel()
	db, load := expiredKeys(t)
	load(1, 100)
	pgtest.FreezeStats(t, db.Pool, "idempotency_keys")
	load(101, 40_100)

	batch := pgtest.Capture(t, db.URL, func(ctx context.Context, tx pgx.Tx) {
		r, err := ordersdb.New(tx).IdempotencyKeysCleanup(ctx, ordersdb.IdempotencyKeysCleanupParams{
			AfterCreatedAt: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), RetentionSeconds: (30 * 24 * time.Hour).Seconds(), BatchSize: 1000})
		require.NoError(t, err)
		require.EqualValues(t, 1000, r.Deleted)
	})
	plan := pgtest.Explain(t, db.Pool, batch...)
	t.Log(plan)
	require.LessOrEqual(t, plan.RowsRead("idempotency_keys"), int64(2_100), "reads the whole table for its batch:\n%s", plan)
}

// expiredKeys makes a database holding one order of alice's, with
// autovacuum off for idempotency_keys, and returns it with a function that
// adds alice's keys key-<from> to key-<to> for that order, created 40 days
// ago one millisecond apart, so past any retention the tests use.
func expiredKeys(t *testing.T) (*pgtest.DB, func(from, to int)) {
	t.Helper()
	db := pgtest.New(t, schema.Orders()...)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		ALTER TABLE idempotency_keys SET (autovacuum_enabled = false);
		INSERT INTO orders (id, customer, email, currency, status, total_cents, version, created_at, updated_at)
		VALUES ('00000000-0000-7000-8000-000000000001', 'alice', 'a@example.com', 'EUR', 'placed', 1, 1, now(), now())`)
	require.NoError(t, err)
	return db, func(from, to int) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, `
			INSERT INTO idempotency_keys (customer, key, request_hash, order_id, created_at)
			SELECT 'alice', 'key-' || lpad(g::text, 6, '0'), '\x00', '00000000-0000-7000-8000-000000000001',
			       now() - interval '40 days' + g * interval '1 ms'
			FROM generate_series($1::int, $2::int) g`, from, to)
		require.NoError(t, err)
	}
}
