package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// lagSample is the chain's backlog at one moment: outbox rows not yet
// delivered, and events committed but not yet applied by the notifier.
type lagSample struct {
	At        time.Time
	Pending   int64
	Unapplied int64
	// Behind is what the notifier alone owes: delivered to the broker
	// but not yet applied.
	Behind int64
}

// sampleLag records the backlog every second until ctx ends.
func sampleLag(ctx context.Context, opool, npool *pgxpool.Pool) []lagSample {
	var out []lagSample
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-t.C:
		}
		var pending, delivered, created, processed int64
		if err := opool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'delivered'), count(*) FROM outbox").Scan(&pending, &delivered, &created); err != nil {
			continue
		}
		if err := npool.QueryRow(ctx, "SELECT count(*) FROM processed_event").Scan(&processed); err != nil {
			continue
		}
		out = append(out, lagSample{At: time.Now(), Pending: pending, Unapplied: created - processed, Behind: max(0, delivered-processed)})
	}
}

// latencyScenario runs the whole chain under a fixed request rate and
// measures, per event, commit to broker acknowledgement and commit to
// applied by the notifier.
func (b *bench) latencyScenario(ctx context.Context) error {
	const sc = "latency"
	odb, err := b.ordersDB(ctx, "latency_orders")
	if err != nil {
		return err
	}
	ndb, err := b.notifierDB(ctx, "latency_notifier")
	if err != nil {
		return err
	}
	opool, err := b.pool(ctx, odb)
	if err != nil {
		return err
	}
	defer opool.Close()
	npool, err := b.pool(ctx, ndb)
	if err != nil {
		return err
	}
	defer npool.Close()
	sink, err := startSMTPSink()
	if err != nil {
		return err
	}
	defer sink.Close()
	broker, baddr, err := b.startBroker(ctx)
	if err != nil {
		return err
	}
	orders, base, err := b.ordersServe(ctx, "orders serve", odb, baddr, true)
	if err != nil {
		return err
	}
	notifier, err := b.notifierServe(ctx, ndb, baddr, sink.addr, base)
	if err != nil {
		return err
	}
	procs := []*proc{broker, orders, notifier}

	sctx, stopSampling := context.WithCancel(ctx)
	var samples []lagSample
	var wg sync.WaitGroup
	wg.Go(func() { samples = sampleLag(sctx, opool, npool) })
	t0 := time.Now()
	load := openLoad(ctx, base, b.opts.Rate, b.opts.LatencyDuration)
	loadEnd := time.Now()
	b.logf("open loop: %d sent, %d created, %d failed, %d dropped in %s", load.Sent, load.OK, load.Failed, load.Dropped, load.Duration.Round(time.Millisecond))
	err = waitFor(ctx, b.opts.DrainTimeout, 250*time.Millisecond, procs, func(ctx context.Context) (bool, error) {
		var pending, created, processed int64
		if err := opool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FROM outbox").Scan(&pending, &created); err != nil {
			return false, err
		}
		if err := npool.QueryRow(ctx, "SELECT count(*) FROM processed_event").Scan(&processed); err != nil {
			return false, err
		}
		return pending == 0 && processed >= created, nil
	})
	stopSampling()
	wg.Wait()
	if err != nil {
		return fmt.Errorf("waiting for the chain to catch up: %w", err)
	}
	for _, p := range []*proc{notifier, orders, broker} {
		if err := b.stopProc(sc, p); err != nil {
			return err
		}
	}

	created := map[uuid.UUID]time.Time{}
	var ack []sample
	rows, err := opool.Query(ctx, "SELECT event_id, created_at, delivered_at FROM outbox WHERE state = 'delivered'")
	if err != nil {
		return err
	}
	for rows.Next() {
		var id uuid.UUID
		var c, d time.Time
		if err := rows.Scan(&id, &c, &d); err != nil {
			return err
		}
		created[id] = c
		ack = append(ack, sample{At: c, MS: ms(d.Sub(c))})
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var applied []sample
	rows, err = npool.Query(ctx, "SELECT event_id, processed_at FROM processed_event WHERE outcome = 'applied'")
	if err != nil {
		return err
	}
	for rows.Next() {
		var id uuid.UUID
		var p time.Time
		if err := rows.Scan(&id, &p); err != nil {
			return err
		}
		if c, ok := created[id]; ok {
			applied = append(applied, sample{At: c, MS: ms(p.Sub(c))})
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(ack) == 0 || len(applied) == 0 {
		return fmt.Errorf("no event went through the chain (%d delivered, %d applied)", len(ack), len(applied))
	}

	httpMS := make([]float64, len(load.Latencies))
	for i, s := range load.Latencies {
		httpMS[i] = s.MS
	}
	httpSum := summarize(httpMS)
	ref, refV := "POST /orders p99", httpSum.P99
	b.rep.add(result{Scenario: sc, Figure: fmt.Sprintf("orders created at %d/s requested (open loop)", b.opts.Rate), Value: float64(load.OK) / load.Duration.Seconds(), Unit: "orders/s",
		Reference: "requested rate", RefValue: float64(b.opts.Rate), Target: "ratio >= 0.99",
		Note: fmt.Sprintf("%d sent, %d failed, %d dropped (more than 2,000 waiting) over %s; POST /orders latency counts from each request's scheduled time", load.Sent, load.Failed, load.Dropped, b.opts.LatencyDuration)})
	b.rep.add(result{Scenario: sc, Figure: "POST /orders p50", Value: httpSum.P50, Unit: "ms"})
	b.rep.add(result{Scenario: sc, Figure: "POST /orders p99", Value: httpSum.P99, Unit: "ms"})

	addLatency := func(what string, s []sample, target string, note string) {
		vals := make([]float64, len(s))
		for i, x := range s {
			vals[i] = x.MS
		}
		sum := summarize(vals)
		win := windowP99(s, t0, 5*time.Second)
		worst := 0.0
		var ws []string
		for _, w := range win {
			worst = max(worst, w)
			ws = append(ws, formatValue(w, ""))
		}
		b.rep.add(result{Scenario: sc, Figure: what + " p50", Value: sum.P50, Unit: "ms", Reference: ref, RefValue: refV})
		b.rep.add(result{Scenario: sc, Figure: what + " p99", Value: sum.P99, Unit: "ms", Reference: ref, RefValue: refV, Target: target,
			Note: fmt.Sprintf("%s; %d events", note, sum.N)})
		b.rep.add(result{Scenario: sc, Figure: what + " max", Value: sum.Max, Unit: "ms", Reference: ref, RefValue: refV})
		b.rep.add(result{Scenario: sc, Figure: what + " worst 5 s p99", Value: worst, Unit: "ms", Reference: ref, RefValue: refV, Target: target,
			Note: what + ", p99 of each 5 s window of commit times (ms): " + strings.Join(ws, " ")})
	}
	addLatency("commit→broker ack", ack, "<= 20 ms",
		"outbox delivered_at (the confirm, after the broker's ack) minus created_at (the insert in the order's transaction, just before its commit)")
	addLatency("commit→applied", applied, "<= 100 ms",
		"notifier processed_event.processed_at (the inbox marker, written in the batch transaction before its commit) minus outbox created_at")

	// Lag: only the samples taken while the load ran.
	var lag, pend, behind []float64
	for _, s := range samples {
		if s.At.After(t0) && !s.At.After(loadEnd) {
			lag = append(lag, float64(s.Unapplied))
			pend = append(pend, float64(s.Pending))
			behind = append(behind, float64(s.Behind))
		}
	}
	if len(lag) > 0 {
		lagSum := summarize(lag)
		pendSum := summarize(pend)
		b.rep.add(result{Scenario: sc, Figure: "unapplied events, max of 1 s samples", Value: lagSum.Max, Unit: "events",
			Reference: "one second of load", RefValue: float64(b.opts.Rate), Target: "ratio <= 0.1",
			Note: fmt.Sprintf("each second during the load: outbox rows minus the notifier's inbox markers (unapplied) and pending outbox rows; unapplied p50 %s, pending p50 %s max %s",
				formatValue(lagSum.P50, ""), formatValue(pendSum.P50, ""), formatValue(pendSum.Max, ""))})
		b.rep.add(result{Scenario: sc, Figure: "unapplied events, trend", Value: slope(lag), Unit: "events/s",
			Reference: "requested rate", RefValue: float64(b.opts.Rate), Target: "flat: |ratio| <= 0.01",
			Note: "least-squares slope of the unapplied samples over the load: positive means the chain falls behind"})
		behindSum := summarize(behind)
		b.rep.add(result{Scenario: sc, Figure: "notifier lag (delivered, not applied), max", Value: behindSum.Max, Unit: "events",
			Reference: "one second of load", RefValue: float64(b.opts.Rate), Target: "ratio <= 0.1",
			Note: fmt.Sprintf("the notifier's own lag, without the relay's: delivered outbox rows minus inbox markers, each second during the load; p50 %s", formatValue(behindSum.P50, ""))})
		b.rep.add(result{Scenario: sc, Figure: "notifier lag, trend", Value: slope(behind), Unit: "events/s",
			Reference: "requested rate", RefValue: float64(b.opts.Rate), Target: "flat: |ratio| <= 0.01"})
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
