package relay_test

import (
	"cmp"
	"context"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/orders/internal/outbox/relay"
	"github.com/outboxref/orders/internal/outbox/relay/drainloop"
)

// BenchmarkBacklogDrain measures how fast one relay drains a committed
// backlog, and how close that is to what the database alone allows. Each
// iteration drains a fresh backlog of N aggregates with versions 1 and 2 of
// each (2N strict events, written one aggregate after the other, as a
// service that creates and soon after updates each aggregate would), at the
// relay's default batch size:
//
//   - Relay: the real relay, sending to kfake over TCP;
//   - SQLLoop: the relay's own read and fenced confirm, each confirm in
//     the round trip of the next read as the relay sends it, with no
//     broker (drainloop, cmd/bench's reference too): the ceiling for Relay;
//   - BrokerLoop: the same loop, also sending each batch to kfake as the
//     relay's records, one batch with the broker while the next is read
//     (drainloop.DrainToBroker): the least any relay must do;
//   - Unordered: a read of the oldest due rows without the strict ordering
//     guard or the partitions, and a confirm by primary key without the
//     epoch fence, in transactions committed like the relay's: one row
//     write per event and nothing else, the ceiling for any polling relay.
//
// Relay/SQLLoop says what sending costs on top of the database work,
// BrokerLoop/SQLLoop how much of that any relay must pay, and
// SQLLoop/Unordered what strict ordering and fencing cost. N is 2,500 (5,000 events)
// so that one iteration is cheap enough for CI; OUTBOX_BENCH_AGGREGATES
// sets a larger backlog and OUTBOX_BENCH_BATCH another batch size:
//
//	OUTBOX_BENCH_AGGREGATES=50000 go test ./internal/outbox/relay -run '^$' \
//	    -bench BacklogDrain -benchtime 1x -count 5 | tee drain.txt
//	benchstat drain.txt
func BenchmarkBacklogDrain(b *testing.B) {
	aggregates := envInt(b, "OUTBOX_BENCH_AGGREGATES", 2_500)
	if testing.Short() {
		aggregates = 100 // make bench-smoke: proves it runs, measures nothing
	}
	batch := envInt(b, "OUTBOX_BENCH_BATCH", 0) // 0: the relay's default
	events := 2 * aggregates

	b.Run("Relay", func(b *testing.B) {
		drainBench(b, aggregates, func(b *testing.B, e *env) {
			var confirmed atomic.Int64
			done := make(chan struct{})
			r := e.relay(b, func(c *relayConfig) {
				c.BatchSize = batch
				c.PollInterval = 0 // the default
				c.Hooks.AfterConfirm = func(_ context.Context, cs []relay.Claim) error {
					if confirmed.Add(int64(len(cs))) == int64(events) {
						close(done)
					}
					return nil
				}
			})
			b.StartTimer()
			rr := start(b, r)
			select {
			case <-done:
			case <-time.After(5 * time.Minute):
				b.Fatalf("%d of %d events confirmed after 5 minutes", confirmed.Load(), events)
			}
			b.StopTimer()
			if err := rr.Stop(b); err != nil {
				b.Fatal(err)
			}
		})
	})

	loops := []struct {
		name  string
		drain func(ctx context.Context, e *env, conn drainloop.DB, size int) (int, error)
	}{
		{"SQLLoop", func(ctx context.Context, _ *env, conn drainloop.DB, size int) (int, error) {
			return drainloop.Drain(ctx, conn, size)
		}},
		{"BrokerLoop", func(ctx context.Context, e *env, conn drainloop.DB, size int) (int, error) {
			return drainloop.DrainToBroker(ctx, conn, e.Conn, topic, "bench", size)
		}},
	}
	for _, l := range loops {
		b.Run(l.name, func(b *testing.B) {
			size := cmp.Or(batch, relay.DefaultBatchSize)
			drainBench(b, aggregates, func(b *testing.B, e *env) {
				ctx := context.Background()
				conn, err := e.DB.Pool.Acquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				defer conn.Release()
				b.StartTimer()
				n, err := l.drain(ctx, e, conn, size)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				if n != events {
					b.Fatalf("the loop confirmed %d of %d events", n, events)
				}
			})
		})
	}

	b.Run("Unordered", func(b *testing.B) {
		size := batch
		if size == 0 {
			size = relay.DefaultBatchSize
		}
		drainBench(b, aggregates, func(b *testing.B, e *env) {
			ctx := context.Background()
			b.StartTimer()
			for total := 0; total < events; {
				var ids []uuid.UUID
				err := relayTx(ctx, e, func(tx pgx.Tx) (err error) {
					ids, err = unorderedClaim(ctx, tx, size)
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
				if len(ids) == 0 {
					b.Fatalf("nothing claimable after %d of %d events", total, events)
				}
				if err := relayTx(ctx, e, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `
						UPDATE outbox SET state = 'delivered', delivered_at = now()
						WHERE event_id = ANY ($1) AND state = 'pending'`, ids)
					return err
				}); err != nil {
					b.Fatal(err)
				}
				total += len(ids)
			}
			b.StopTimer()
		})
	})
}

// drainBench runs drain once per iteration on a fresh database holding a
// fresh backlog, and reports events/s over the time drain kept the timer
// running. drain starts the timer once its setup is done and stops it
// once the backlog is delivered.
func drainBench(b *testing.B, aggregates int, drain func(*testing.B, *env)) {
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		e := setup(b)
		insertBacklog(b, e, aggregates)
		began := b.Elapsed()
		drain(b, e)
		total += b.Elapsed() - began
		b.StartTimer()
	}
	b.ReportMetric(float64(2*aggregates*b.N)/total.Seconds(), "events/s")
}

// insertBacklog commits versions 1 and 2 of each aggregate as pending strict
// events, one aggregate after the other, in one statement (the Writer
// would take longer than the drain), then updates the planner's statistics
// as autovacuum would on a table that has been in use.
func insertBacklog(b *testing.B, e *env, aggregates int) {
	b.Helper()
	ctx := context.Background()
	if _, err := e.DB.Pool.Exec(ctx, `
		INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type,
		                    schema_version, payload, created_at, next_attempt_at)
		SELECT gen_random_uuid(), 'test', 'agg-' || a, v, $1, 1, jsonb_build_object('n', v), t, t
		FROM generate_series(1, $2::integer) a, generate_series(1, 2) v,
		     LATERAL (SELECT now() - interval '1 hour' + make_interval(secs => (2 * a + v) / 1e6) AS t) c`,
		strictType, aggregates); err != nil {
		b.Fatal(err)
	}
	if _, err := e.DB.Pool.Exec(ctx, "VACUUM ANALYZE outbox"); err != nil {
		b.Fatal(err)
	}
}

// relayTx runs fn in a transaction committed the way the relay commits its
// claims and confirms, so that Unordered differs from SQLLoop only in
// the statements.
func relayTx(ctx context.Context, e *env, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, e.DB.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
			return err
		}
		return fn(tx)
	})
}

// unorderedClaim reads up to size pending rows in due order with no
// ordering guard and no partitions: the relay's read minus both.
func unorderedClaim(ctx context.Context, tx pgx.Tx, size int) ([]uuid.UUID, error) {
	rows, err := tx.Query(ctx, `
		SELECT o.event_id, o.aggregate_type, o.aggregate_id, o.aggregate_version,
		       o.event_type, o.schema_version, o.payload, o.traceparent, o.tracestate, o.created_at,
		       o.attempts, o.next_attempt_at, o.publish_mode, o.relay_partition
		FROM outbox o
		WHERE o.state = 'pending' AND o.next_attempt_at <= now()
		ORDER BY o.next_attempt_at, o.created_at, o.aggregate_version
		LIMIT $1`, size)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []uuid.UUID
	for rows.Next() {
		vals, err := rows.Values() // read every column, as the relay does
		if err != nil {
			return nil, err
		}
		ids = append(ids, vals[0].(uuid.UUID)) // the pool decodes uuids with the google/uuid codec
	}
	return ids, rows.Err()
}

// envInt reads a positive integer setting of the benchmark, or def.
func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		b.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}
