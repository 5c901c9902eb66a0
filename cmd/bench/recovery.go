package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// tableStats is the outbox table's footprint at one moment.
type tableStats struct {
	Heap, Indexes, Total int64 // bytes
	Live, Dead           int64 // count(*), n_dead_tup
}

func outboxTableStats(ctx context.Context, pool *pgxpool.Pool) (tableStats, error) {
	// The statistics collector publishes counts with a delay of up to a
	// second after a transaction ends.
	time.Sleep(1500 * time.Millisecond)
	var s tableStats
	err := pool.QueryRow(ctx, `SELECT pg_relation_size('outbox'), pg_indexes_size('outbox'), pg_total_relation_size('outbox'),
			(SELECT count(*) FROM outbox), coalesce(n_dead_tup, 0)
		FROM pg_stat_user_tables WHERE relname = 'outbox'`).Scan(&s.Heap, &s.Indexes, &s.Total, &s.Live, &s.Dead)
	return s, err
}

// recoveryScenario drains a large backlog, as after a long broker outage,
// and records how the table and its indexes grew.
func (b *bench) recoveryScenario(ctx context.Context) error {
	const sc = "recovery"
	n := b.opts.RecoveryBacklog / 2 * 2
	db, err := b.ordersDB(ctx, "recovery")
	if err != nil {
		return err
	}
	if err := b.fillBacklog(ctx, db, n); err != nil {
		return err
	}
	pool, err := b.pool(ctx, db)
	if err != nil {
		return err
	}
	defer pool.Close()
	before, err := outboxTableStats(ctx, pool)
	if err != nil {
		return err
	}
	took, _, err := b.relayDrain(ctx, sc, db, n, b.opts.RelayBatch)
	if err != nil {
		return err
	}
	rate := float64(n) / took.Seconds()
	b.logf("orders relay: %d events in %s", n, took.Round(time.Millisecond))
	after, err := outboxTableStats(ctx, pool)
	if err != nil {
		return err
	}

	r := result{Scenario: sc, Figure: fmt.Sprintf("orders relay drain, %d events", n), Value: rate, Unit: "events/s", Target: "ratio >= 0.9",
		Note: "the reference is the relay scenario's drain of a smaller backlog in the same run: the rate should not fall with the backlog's size"}
	if b.relayRate > 0 {
		r.Reference, r.RefValue = fmt.Sprintf("relay drain, %d events", b.opts.Backlog/2*2), b.relayRate
	} else {
		r.Target, r.Note = "-", "run the relay scenario too for a reference"
	}
	b.rep.add(r)
	b.rep.add(result{Scenario: sc, Figure: "time to drain", Value: took.Seconds(), Unit: "s"})
	mib := func(v int64) float64 { return float64(v) / (1 << 20) }
	for _, f := range []struct {
		what          string
		before, after int64
	}{
		{"outbox heap (pg_relation_size)", before.Heap, after.Heap},
		{"outbox indexes (pg_indexes_size)", before.Indexes, after.Indexes},
		{"outbox total (pg_total_relation_size)", before.Total, after.Total},
	} {
		b.rep.add(result{Scenario: sc, Figure: f.what + " after", Value: mib(f.after), Unit: "MiB",
			Reference: "before", RefValue: mib(f.before)})
	}
	b.rep.add(result{Scenario: sc, Figure: "outbox n_dead_tup after", Value: float64(after.Dead), Unit: "rows",
		Reference: "rows in the table", RefValue: float64(n),
		Note: fmt.Sprintf("pg_stat_user_tables; before the drain: n_dead_tup %d, %d rows; after: %d rows (autovacuum may run during the drain)", before.Dead, before.Live, after.Live)})
	return nil
}
