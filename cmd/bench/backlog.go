package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox/relay/drainloop"
)

// fillSQL writes aggregates lo..hi as committed outbox rows, two per order:
// order.placed (version 1) and order.paid (version 2), with the payloads
// of schema version 1 as the orders service writes them. Each order is
// paid 500 orders after it was placed, so the two versions are
// interleaved the way a steady stream of orders would leave them. The rows
// are due and ordered by their creation time ($3 plus 10 µs per order).
//
// Order ids and event ids are UUIDv7 taken at the order's and the event's
// time, as the service makes them (uuid.NewV7: 48 bits of milliseconds,
// then the fraction of the millisecond in 12 bits, then random bits), so
// that a drain in time order touches the primary key and the aggregate
// key where the service's own backlog would: near their ends. Random ids
// would send every confirm to pages all over both indexes (benchmarks.md,
// "Recovery").
const fillSQL = `
INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type,
                    schema_version, payload, created_at, next_attempt_at)
SELECT bench_uuid7(x.t, md5($1::text || o.i || '/' || v.n)), 'order', o.id::text, v.n,
       CASE v.n WHEN 1 THEN 'order.placed' ELSE 'order.paid' END, 1,
       CASE v.n WHEN 1 THEN jsonb_build_object(
                'order_id', o.id, 'customer', o.customer, 'email', o.customer || '@example.com',
                'currency', 'EUR',
                'items', jsonb_build_array(jsonb_build_object('sku', 'BOOK-' || (o.i % 50), 'quantity', 2, 'unit_price_cents', 1250)),
                'total_cents', 2500, 'placed_at', o.t1)
            ELSE jsonb_build_object(
                'order_id', o.id, 'email', o.customer || '@example.com', 'currency', 'EUR',
                'total_cents', 2500, 'paid_at', o.t2)
       END,
       x.t, x.t
FROM (SELECT i, bench_uuid7($3::timestamptz + i * interval '10 microseconds', md5($1::text || i)) AS id,
             'customer-' || (i % 1000) AS customer,
             $3::timestamptz + i * interval '10 microseconds' AS t1,
             $3::timestamptz + (i + 500) * interval '10 microseconds' AS t2
      FROM generate_series($2::bigint, $4::bigint) AS i) o
CROSS JOIN (VALUES (1), (2)) AS v(n)
CROSS JOIN LATERAL (SELECT CASE v.n WHEN 1 THEN o.t1 ELSE o.t2 END AS t) x
ORDER BY x.t`

// uuid7SQL creates bench_uuid7(t, h), the UUIDv7 of time t with the random
// bits taken from the hex digits h, in the benchmark's own databases only.
// PostgreSQL 15 has no uuidv7().
const uuid7SQL = `
CREATE OR REPLACE FUNCTION bench_uuid7(t timestamptz, h text) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT (lpad(to_hex(floor(extract(epoch FROM t) * 1000)::bigint), 12, '0')
        || '7'
        || lpad(to_hex(floor((extract(epoch FROM t) * 1000 - floor(extract(epoch FROM t) * 1000)) * 4096)::int), 3, '0')
        || substr('89ab', 1 + get_byte(decode(substr(h, 1, 2), 'hex'), 0) % 4, 1)
        || substr(h, 3, 15))::uuid
$$`

// fillBacklog writes events committed, pending outbox rows (events/2
// orders, two events each) and leaves the table vacuumed and analysed, as a
// backlog left by an outage would be after autovacuum ran.
func (b *bench) fillBacklog(ctx context.Context, db string, events int) error {
	pool, err := b.pool(ctx, db)
	if err != nil {
		return err
	}
	defer pool.Close()
	salt := make([]byte, 8)
	_, _ = rand.Read(salt)
	orders := int64(events / 2)
	base := time.Now().Add(-time.Hour)
	const chunk = 50000
	start := time.Now()
	if _, err := pool.Exec(ctx, uuid7SQL); err != nil {
		return fmt.Errorf("fill outbox: %w", err)
	}
	for lo := int64(0); lo < orders; lo += chunk {
		hi := min(lo+chunk, orders) - 1
		if _, err := pool.Exec(ctx, fillSQL, hex.EncodeToString(salt), lo, base, hi); err != nil {
			return fmt.Errorf("fill outbox: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, "DROP FUNCTION bench_uuid7"); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) outbox"); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return err
	}
	b.logf("backlog of %d events written in %s", orders*2, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// outboxStates counts the outbox rows by state.
func outboxStates(ctx context.Context, pool *pgxpool.Pool) (map[string]int64, error) {
	rows, err := pool.Query(ctx, "SELECT state, count(*) FROM outbox GROUP BY state")
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for rows.Next() {
		var s string
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		out[s] = n
	}
	return out, rows.Err()
}

// drainTime waits until no outbox row is pending and returns the time
// from start to the last delivery (delivered_at of the last confirm).
func drainTime(ctx context.Context, pool *pgxpool.Pool, start time.Time, timeout time.Duration, procs []*proc) (time.Duration, error) {
	err := waitFor(ctx, timeout, 200*time.Millisecond, procs, func(ctx context.Context) (bool, error) {
		var pending bool
		err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM outbox WHERE state = 'pending')").Scan(&pending)
		return !pending, err
	})
	if err != nil {
		return 0, err
	}
	var last *time.Time
	if err := pool.QueryRow(ctx, "SELECT max(delivered_at) FROM outbox").Scan(&last); err != nil {
		return 0, err
	}
	if last == nil {
		return 0, fmt.Errorf("no row was delivered")
	}
	return last.Sub(start), nil
}

// checkDelivered fails unless every one of want rows was delivered.
func checkDelivered(ctx context.Context, pool *pgxpool.Pool, want int) error {
	st, err := outboxStates(ctx, pool)
	if err != nil {
		return err
	}
	if st["delivered"] != int64(want) {
		return fmt.Errorf("outbox after the drain: %v, want %d delivered", st, want)
	}
	return nil
}

// claimConfirmLoop drains the outbox with the relay's own statements and
// no broker (drainloop): read a batch (strict ordering for every type, as
// the orders service registers them), confirm it with made-up positions in
// the round trip of the next read, repeat. Those round trips set the
// relaxed commit themselves, as the relay's do, so the connection keeps
// the server's setting.
func claimConfirmLoop(ctx context.Context, pool *pgxpool.Pool, batch int) (int, time.Duration, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Release()
	start := time.Now()
	n, err := drainloop.Drain(ctx, conn, batch)
	if err != nil {
		return n, 0, err
	}
	return n, time.Since(start), nil
}

// brokerLoop drains the outbox like claimConfirmLoop, and also sends every
// batch to the broker at addr as the relay's records, with a client set up
// as the relay's is, confirming each at the broker's positions; one batch
// is with the broker while the next is read (drainloop.DrainToBroker). It
// is the least work any relay of these events must do on this host.
func brokerLoop(ctx context.Context, pool *pgxpool.Pool, addr string, batch int) (int, time.Duration, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Release()
	start := time.Now()
	n, err := drainloop.DrainToBroker(ctx, conn, []kgo.Opt{kgo.SeedBrokers(addr)}, topic, "bench", batch)
	if err != nil {
		return n, 0, err
	}
	return n, time.Since(start), nil
}

// unorderedLoop drains the outbox with the plain pattern that ignores
// aggregate order, shaped like the relay's loop so that only the ordering
// guard differs: a claim that leases the oldest pending rows, skipping
// locked ones, in one statement; then a confirm by primary key in another;
// each its own transaction, committed as the relay commits its own.
//
// Oldest is taken in the order of the outbox's pending index
// (next_attempt_at, created_at), which for a backlog that never failed is
// the order of created_at: ORDER BY created_at alone has no index and
// would sort every pending row for each batch (about 150 ms a batch with
// 100,000 pending here), which measures the sort, not the claim.
func unorderedLoop(ctx context.Context, pool *pgxpool.Pool, batch int) (int, time.Duration, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Release()
	if err := relaxCommits(ctx, conn); err != nil {
		return 0, 0, err
	}
	start := time.Now()
	var n int
	for {
		token := uuid.New()
		rows, err := conn.Query(ctx, `UPDATE outbox SET lease_owner = 'bench-unordered', lease_token = $2,
				lease_expires_at = now() + interval '30 seconds'
			WHERE event_id IN (
				SELECT event_id FROM outbox
				WHERE state = 'pending' AND next_attempt_at <= now()
				  AND (lease_expires_at IS NULL OR lease_expires_at <= now())
				ORDER BY next_attempt_at, created_at LIMIT $1 FOR UPDATE SKIP LOCKED)
			RETURNING event_id`, batch, token)
		if err != nil {
			return n, 0, fmt.Errorf("unordered claim: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return n, 0, fmt.Errorf("unordered claim: %w", err)
		}
		if len(ids) == 0 {
			break
		}
		if _, err := conn.Exec(ctx, `UPDATE outbox SET state = 'delivered', delivered_at = now(),
				lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
			WHERE event_id = ANY($1) AND lease_token = $2`, ids, token); err != nil {
			return n, 0, fmt.Errorf("unordered confirm: %w", err)
		}
		n += len(ids)
	}
	return n, time.Since(start), nil
}

// relaxCommits makes a reference loop commit as the relay commits its
// claims and confirms: without waiting for the WAL flush (see the relay's
// inRelayTx). Comparing a loop that waits for the disk twice per batch
// with a relay that does not would measure the disk, not the statements.
func relaxCommits(ctx context.Context, conn *pgxpool.Conn) error {
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		return fmt.Errorf("relax commits: %w", err)
	}
	return nil
}
