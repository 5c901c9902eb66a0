package main

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// relayEnv is the environment of `orders relay` against db and broker.
func (b *bench) relayEnv(db, broker string) (map[string]string, string, error) {
	metrics, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	env := map[string]string{
		"DATABASE_URL":       b.dbURL(db),
		"KAFKA_BROKERS":      broker,
		"ORDERS_TOPIC":       topic,
		"RELAY_METRICS_ADDR": metrics,
	}
	if b.opts.RelayBatch > 0 {
		env["RELAY_BATCH_SIZE"] = strconv.Itoa(b.opts.RelayBatch)
	}
	return env, metrics, nil
}

// relayDrain starts a broker and `orders relay` on db, waits until the
// backlog of n events is delivered and returns the time it took, from the
// start of the process to the last confirm.
func (b *bench) relayDrain(ctx context.Context, scenario, db string, n int) (time.Duration, error) {
	broker, addr, err := b.startBroker(ctx)
	if err != nil {
		return 0, err
	}
	env, metrics, err := b.relayEnv(db, addr)
	if err != nil {
		return 0, err
	}
	pool, err := b.pool(ctx, db)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	start := time.Now()
	relay, err := b.start("orders relay", b.bins["orders"], env, "relay")
	if err != nil {
		return 0, err
	}
	// Ready is only for the RSS baseline: the clock started above.
	if err := relay.waitHTTP(ctx, "http://"+metrics+"/readyz"); err != nil {
		return 0, err
	}
	d, err := drainTime(ctx, pool, start, b.opts.DrainTimeout, []*proc{relay, broker})
	if err != nil {
		return 0, fmt.Errorf("relay drain: %w", err)
	}
	if err := b.stopProc(scenario, relay); err != nil {
		return 0, err
	}
	if err := b.stopProc(scenario, broker); err != nil {
		return 0, err
	}
	return d, checkDelivered(ctx, pool, n)
}

// relayScenario drains the same backlog three times: with the relay (to
// the broker), with the relay's claim and confirm statements alone, and
// with the plain unordered claim.
func (b *bench) relayScenario(ctx context.Context) error {
	const sc = "relay"
	n := b.opts.Backlog / 2 * 2
	src, err := b.ordersDB(ctx, "relay_src")
	if err != nil {
		return err
	}
	if err := b.fillBacklog(ctx, src, n); err != nil {
		return err
	}
	var copies [3]string
	for i := range copies {
		if copies[i], err = b.newDB(ctx, "relay", src); err != nil {
			return err
		}
	}

	relayTime, err := b.relayDrain(ctx, sc, copies[0], n)
	if err != nil {
		return err
	}
	relayRate := float64(n) / relayTime.Seconds()
	b.relayRate = relayRate
	b.logf("orders relay: %d events in %s", n, relayTime.Round(time.Millisecond))

	pool, err := b.pool(ctx, copies[1])
	if err != nil {
		return err
	}
	got, loopTime, err := claimConfirmLoop(ctx, pool, b.opts.batchSize())
	pool.Close()
	if err != nil {
		return err
	}
	if got != n {
		return fmt.Errorf("claim/confirm loop confirmed %d of %d events", got, n)
	}
	loopRate := float64(n) / loopTime.Seconds()
	b.logf("claim/confirm SQL loop: %d events in %s", n, loopTime.Round(time.Millisecond))

	pool, err = b.pool(ctx, copies[2])
	if err != nil {
		return err
	}
	got, unTime, err := unorderedLoop(ctx, pool, b.opts.batchSize())
	pool.Close()
	if err != nil {
		return err
	}
	if got != n {
		return fmt.Errorf("unordered loop delivered %d of %d events", got, n)
	}
	unRate := float64(n) / unTime.Seconds()
	b.logf("unordered SQL loop: %d events in %s", n, unTime.Round(time.Millisecond))

	batch := fmt.Sprintf("batch %d", b.opts.batchSize())
	b.rep.add(result{Scenario: sc, Figure: fmt.Sprintf("orders relay drain, %d events", n), Value: relayRate, Unit: "events/s",
		Reference: "claim/confirm SQL loop", RefValue: loopRate, Target: "ratio >= 0.9",
		Note: "relay: from starting `orders relay` to the last delivered_at; SQL loop: the relay's OutboxClaim and OutboxConfirm statements on one connection, " + batch + ", no broker"})
	b.rep.add(result{Scenario: sc, Figure: "claim/confirm SQL loop (strict order)", Value: loopRate, Unit: "events/s",
		Reference: "unordered SQL loop", RefValue: unRate, Target: "ratio >= 0.8",
		Note: "unordered: a lease UPDATE of SELECT event_id ... WHERE state='pending' AND next_attempt_at <= now() ORDER BY next_attempt_at, created_at LIMIT n FOR UPDATE SKIP LOCKED (the pending index's order, which is created_at's for this backlog), then a confirm UPDATE by primary key; both loops commit without waiting for the WAL flush, as the relay does; " + batch})
	return nil
}
