package main

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// relayEnv is the environment of `orders relay` against db and broker, with
// RELAY_BATCH_SIZE set to batch (0: the service's default).
func (b *bench) relayEnv(db, broker string, batch int) (map[string]string, string, error) {
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
	if batch > 0 {
		env["RELAY_BATCH_SIZE"] = strconv.Itoa(batch)
	}
	return env, metrics, nil
}

// relayDrain starts a broker and `orders relay` on db with RELAY_BATCH_SIZE
// batch (0: the service's default), waits until the backlog of n events is
// delivered and returns the time it took, from the start of the process to
// the last confirm, and the cores each process kept busy meanwhile.
func (b *bench) relayDrain(ctx context.Context, scenario, db string, n, batch int) (time.Duration, cores, error) {
	broker, addr, err := b.startBroker(ctx)
	if err != nil {
		return 0, cores{}, err
	}
	env, metrics, err := b.relayEnv(db, addr, batch)
	if err != nil {
		return 0, cores{}, err
	}
	pool, err := b.pool(ctx, db)
	if err != nil {
		return 0, cores{}, err
	}
	defer pool.Close()
	start := time.Now()
	relay, err := b.start("orders relay", b.bins["orders"], env, "relay")
	if err != nil {
		return 0, cores{}, err
	}
	meter := startCPU(map[string]int{"orders relay": relay.pid(), "devbroker": broker.pid(), "bench (polling)": selfPID()}, b.runID)
	// Ready is only for the RSS baseline: the clock started above.
	if err := relay.waitHTTP(ctx, "http://"+metrics+"/readyz"); err != nil {
		return 0, cores{}, err
	}
	d, err := drainTime(ctx, pool, start, b.opts.DrainTimeout, []*proc{relay, broker})
	if err != nil {
		return 0, cores{}, fmt.Errorf("relay drain: %w", err)
	}
	used := meter.stop()
	if err := b.stopProc(scenario, relay); err != nil {
		return 0, cores{}, err
	}
	if err := b.stopProc(scenario, broker); err != nil {
		return 0, cores{}, err
	}
	return d, used, checkDelivered(ctx, pool, n)
}

// relayScenario drains the same backlog three times at each batch size
// (opts.relayBatches): with the relay (to the broker), with the relay's
// read and confirm statements alone, and with the plain unordered claim;
// then once with Watermill's Forwarder.
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
	batches := b.opts.relayBatches()
	for i, batch := range batches {
		rate, err := b.relayAtBatch(ctx, sc, src, n, batch)
		if err != nil {
			return err
		}
		if i == 0 {
			// The first size is the relay's default (or the one asked
			// for): the reference of Watermill's row and of recovery.
			b.relayRate = rate
		}
	}

	if !b.opts.Watermill {
		return nil
	}
	wmRate, err := b.watermillReference(ctx, sc, src, n)
	if err != nil {
		return err
	}
	b.rep.add(result{Scenario: sc, Figure: fmt.Sprintf("orders relay / Watermill Forwarder, %d events, batch %d", n, batches[0]), Value: b.relayRate, Unit: "events/s",
		Reference: "Watermill SQL Forwarder", RefValue: wmRate, Target: "ratio >= 8",
		Note: "Watermill v1.5 components/forwarder over watermill-sql v4 (PostgreSQL schema and offsets adapters, subscriber batch 100) to watermill-kafka v3's publisher (sarama, acks from all in-sync replicas, idempotent); the same events and payloads, written into its table by its SQL publisher in transactions of 1,000 events; timed from its start to the commit of the consumer group's last offset, in the benchmark process"})
	return nil
}

// relayAtBatch drains four copies of the backlog in src at one batch size:
// with `orders relay`, with its read and confirm statements in a loop, with
// that loop sending to a broker too, and with the unordered claim. It
// reports the ratios and returns the relay's rate.
func (b *bench) relayAtBatch(ctx context.Context, sc, src string, n, batch int) (float64, error) {
	var copies [4]string
	var err error
	for i := range copies {
		if copies[i], err = b.newDB(ctx, "relay", src); err != nil {
			return 0, err
		}
	}

	relayTime, relayCPU, err := b.relayDrain(ctx, sc, copies[0], n, batch)
	if err != nil {
		return 0, err
	}
	relayRate := float64(n) / relayTime.Seconds()
	b.logf("orders relay, batch %d: %d events in %s", batch, n, relayTime.Round(time.Millisecond))

	pool, err := b.pool(ctx, copies[1])
	if err != nil {
		return 0, err
	}
	loopMeter := startCPU(map[string]int{"bench (SQL client)": selfPID()}, b.runID)
	got, loopTime, err := claimConfirmLoop(ctx, pool, batch)
	loopCPU := loopMeter.stop()
	pool.Close()
	if err != nil {
		return 0, err
	}
	if got != n {
		return 0, fmt.Errorf("claim/confirm loop confirmed %d of %d events", got, n)
	}
	loopRate := float64(n) / loopTime.Seconds()
	b.logf("claim/confirm SQL loop, batch %d: %d events in %s", batch, n, loopTime.Round(time.Millisecond))

	pool, err = b.pool(ctx, copies[2])
	if err != nil {
		return 0, err
	}
	got, unTime, err := unorderedLoop(ctx, pool, batch)
	pool.Close()
	if err != nil {
		return 0, err
	}
	if got != n {
		return 0, fmt.Errorf("unordered loop delivered %d of %d events", got, n)
	}
	unRate := float64(n) / unTime.Seconds()
	b.logf("unordered SQL loop, batch %d: %d events in %s", batch, n, unTime.Round(time.Millisecond))

	brokerProc, addr, err := b.startBroker(ctx)
	if err != nil {
		return 0, err
	}
	pool, err = b.pool(ctx, copies[3])
	if err != nil {
		return 0, err
	}
	brokerMeter := startCPU(map[string]int{"bench (SQL client and producer)": selfPID(), "devbroker": brokerProc.pid()}, b.runID)
	got, brokerTime, err := brokerLoop(ctx, pool, addr, batch)
	brokerCPU := brokerMeter.stop()
	pool.Close()
	if err != nil {
		return 0, err
	}
	if err := b.stopProc(sc, brokerProc); err != nil {
		return 0, err
	}
	if got != n {
		return 0, fmt.Errorf("loop with a broker confirmed %d of %d events", got, n)
	}
	brokerRate := float64(n) / brokerTime.Seconds()
	b.logf("SQL loop with a broker, batch %d: %d events in %s", batch, n, brokerTime.Round(time.Millisecond))

	label := fmt.Sprintf("batch %d", batch)
	b.rep.add(result{Scenario: sc, Figure: fmt.Sprintf("orders relay drain, %d events, %s", n, label), Value: relayRate, Unit: "events/s",
		Reference: "claim/confirm SQL loop", RefValue: loopRate, Target: "ratio >= 0.9",
		Note: "relay: from starting `orders relay` to the last delivered_at; SQL loop: the relay's own statements (every partition taken, then OutboxRead, and OutboxConfirm fenced by the partitions' epochs sent in the round trip of the next read, as the relay sends it under a backlog) on one connection, " + label + ", no broker"})
	b.rep.add(result{Scenario: sc, Figure: "claim/confirm SQL loop (strict order), " + label, Value: loopRate, Unit: "events/s",
		Reference: "unordered SQL loop", RefValue: unRate, Target: "ratio >= 0.8",
		Note: "unordered: a lease UPDATE of SELECT event_id ... WHERE state='pending' AND next_attempt_at <= now() ORDER BY next_attempt_at, created_at LIMIT n FOR UPDATE SKIP LOCKED (the pending index's order, which is created_at's for this backlog), then a confirm UPDATE by primary key; both loops commit without waiting for the WAL flush, as the relay does; " + label})
	b.rep.add(result{Scenario: sc, Figure: "SQL loop with a broker, " + label, Value: brokerRate, Unit: "events/s",
		Reference: "claim/confirm SQL loop", RefValue: loopRate, Target: "-",
		Note: "the same loop, also sending each batch to devbroker as the relay's records (CloudEvents headers, key the aggregate id, acks from every in-sync replica, no linger, the client's default compression) from the same process, and confirming at the broker's positions; one batch with the broker while the next is read, as in the relay: the least any relay of these events must do on this host, " + label})
	b.rep.add(result{Scenario: sc, Figure: "orders relay drain, " + label, Value: relayRate, Unit: "events/s",
		Reference: "SQL loop with a broker", RefValue: brokerRate, Target: "-",
		Note: "what the relay costs beyond the least a relay must do: its process start, upkeep, spans, metrics and checks"})
	// What one event cost the whole machine in each: on two cores shared
	// by the database, the relay and the broker, the relay's and the
	// broker's CPU is what the loop's database does not have to share.
	relayMS, _ := relayCPU.perEvent(relayRate)
	loopMS, _ := loopCPU.perEvent(loopRate)
	b.rep.add(result{Scenario: sc, Figure: "CPU per event, orders relay, " + label, Value: 1000 * relayMS, Unit: "µs",
		Reference: "SQL loop", RefValue: 1000 * loopMS, Target: "-",
		Note: "the whole machine's busy cores over the drain, divided by the events per second; relay: " + relayCPU.String() + "; loop: " + loopCPU.String()})
	b.addCores(sc, "relay, "+label+": ", relayCPU)
	brokerMS, _ := brokerCPU.perEvent(brokerRate)
	b.rep.add(result{Scenario: sc, Figure: "CPU per event, SQL loop with a broker, " + label, Value: 1000 * brokerMS, Unit: "µs",
		Reference: "SQL loop", RefValue: 1000 * loopMS, Target: "-",
		Note: "the whole machine's busy cores over the drain, divided by the events per second; loop with a broker: " + brokerCPU.String()})
	b.addCores(sc, "SQL loop, "+label+": ", loopCPU)
	b.addCores(sc, "SQL loop with a broker, "+label+": ", brokerCPU)
	return relayRate, nil
}

// watermillReference loads the events of the outbox in src into a fresh
// database the way Watermill's Forwarder stores them and returns the rate
// at which the Forwarder drains them to a fresh broker.
func (b *bench) watermillReference(ctx context.Context, sc, src string, n int) (float64, error) {
	spool, err := b.pool(ctx, src)
	if err != nil {
		return 0, err
	}
	events, err := readOutbox(ctx, spool)
	spool.Close()
	if err != nil {
		return 0, err
	}
	if len(events) != n {
		return 0, fmt.Errorf("source outbox holds %d events, want %d", len(events), n)
	}
	db, err := b.newDB(ctx, "relay_watermill", "")
	if err != nil {
		return 0, err
	}
	wpool, err := b.pool(ctx, db)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	err = loadWatermill(ctx, wpool, events)
	wpool.Close()
	if err != nil {
		return 0, err
	}
	b.logf("Watermill table: %d events written in %s", n, time.Since(start).Round(100*time.Millisecond))
	broker, addr, err := b.startBroker(ctx)
	if err != nil {
		return 0, err
	}
	took, err := b.watermillDrain(ctx, db, addr, n)
	if err != nil {
		return 0, err
	}
	b.logf("Watermill Forwarder: %d events in %s", n, took.Round(time.Millisecond))
	if err := b.stopProc(sc, broker); err != nil {
		return 0, err
	}
	return float64(n) / took.Seconds(), nil
}
