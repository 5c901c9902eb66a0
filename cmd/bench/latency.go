package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// lagSample is the chain's backlog at one moment: outbox rows not yet
// delivered, events committed but not yet applied by the notifier, and
// emails not yet sent.
type lagSample struct {
	At        time.Time
	Pending   int64
	Unapplied int64
	// Behind is what the notifier alone owes: delivered to the broker
	// but not yet applied.
	Behind int64
	// Unsent counts the ledger's emails waiting for the sender or being
	// sent (states pending and sending).
	Unsent int64
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
		// The notifier's counts first: what it applied was committed in the
		// outbox before, so counting the outbox after never makes a lag
		// negative.
		var pending, delivered, created, processed, unsent int64
		if err := npool.QueryRow(ctx, "SELECT (SELECT count(*) FROM processed_event), (SELECT count(*) FROM email_send WHERE state IN ('pending', 'sending'))").Scan(&processed, &unsent); err != nil {
			continue
		}
		if err := opool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'delivered'), count(*) FROM outbox").Scan(&pending, &delivered, &created); err != nil {
			continue
		}
		out = append(out, lagSample{At: time.Now(), Pending: pending, Unapplied: created - processed, Behind: max(0, delivered-processed), Unsent: unsent})
	}
}

// chainRun is one run of the whole chain (orders serve with its relay,
// notifier serve, devbroker, the SMTP sink) under open-loop creates.
type chainRun struct {
	Rate    int
	Load    openResult
	T0      time.Time
	Samples []lagSample // taken while the load ran
	CPU     cores       // over the load
	// Ack and Applied are per event, commit → broker ack and commit →
	// applied; only when the run waited for the chain to drain.
	Ack, Applied []sample
	Peaks        []procPeak
	// Claims and Sent are the sender's scans of its pending index (one per
	// claim) and the emails sent, read once the notifier has stopped; only
	// when the run waited for the chain to drain.
	Claims, Sent int64
}

// reached is the create rate the load achieved.
func (r *chainRun) reached() float64 {
	if r.Load.Duration <= 0 {
		return 0
	}
	return float64(r.Load.OK) / r.Load.Duration.Seconds()
}

// series returns one lag of the samples as numbers.
func (r *chainRun) series(f func(lagSample) int64) []float64 {
	out := make([]float64, len(r.Samples))
	for i, s := range r.Samples {
		out[i] = float64(f(s))
	}
	return out
}

// procPeak is a stopped process's peak resident set and its resident set
// once ready, in MiB.
type procPeak struct {
	Name       string
	Peak, Idle float64
}

// runChain starts the whole chain on fresh databases, sends creates at
// rate for d, and stops it. With drain it first waits for the chain to
// deliver and apply everything, then reads every event's latencies.
func (b *bench) runChain(ctx context.Context, label string, rate int, d time.Duration, drain bool) (*chainRun, error) {
	run := &chainRun{Rate: rate}
	odb, err := b.ordersDB(ctx, label+"_orders")
	if err != nil {
		return nil, err
	}
	ndb, err := b.notifierDB(ctx, label+"_notifier")
	if err != nil {
		return nil, err
	}
	opool, err := b.pool(ctx, odb)
	if err != nil {
		return nil, err
	}
	defer opool.Close()
	npool, err := b.pool(ctx, ndb)
	if err != nil {
		return nil, err
	}
	defer npool.Close()
	sink, err := startSMTPSink()
	if err != nil {
		return nil, err
	}
	defer sink.Close()
	broker, baddr, err := b.startBroker(ctx)
	if err != nil {
		return nil, err
	}
	orders, base, err := b.ordersServe(ctx, "orders serve", odb, baddr, true)
	if err != nil {
		return nil, err
	}
	notifier, err := b.notifierServe(ctx, ndb, baddr, sink.addr, base)
	if err != nil {
		return nil, err
	}
	procs := []*proc{broker, orders, notifier}
	if err := warmUp(ctx, b.opts.DrainTimeout, base, npool, procs); err != nil {
		return nil, err
	}
	stopChain := func() error {
		for _, p := range []*proc{notifier, orders, broker} {
			peak, err := p.stop(60 * time.Second)
			if err != nil {
				return err
			}
			run.Peaks = append(run.Peaks, procPeak{Name: p.name, Peak: peak, Idle: p.idleRSS})
		}
		return nil
	}

	sctx, stopSampling := context.WithCancel(ctx)
	var samples []lagSample
	var wg sync.WaitGroup
	wg.Go(func() { samples = sampleLag(sctx, opool, npool) })
	meter := startCPU(map[string]int{"orders serve": orders.pid(), "notifier serve": notifier.pid(),
		"devbroker": broker.pid(), "bench (load, SMTP sink)": selfPID()}, b.runID)
	run.T0 = time.Now()
	run.Load = openLoad(ctx, base, rate, d)
	run.CPU = meter.stop()
	loadEnd := time.Now()
	b.logf("%d/s asked: %d sent, %d created, %d failed, %d dropped in %s; %s", rate, run.Load.Sent, run.Load.OK, run.Load.Failed,
		run.Load.Dropped, run.Load.Duration.Round(time.Millisecond), run.CPU)
	if !drain {
		stopSampling()
		wg.Wait()
		run.Samples = during(samples, run.T0, loadEnd)
		for _, p := range procs {
			if err := p.check(); err != nil {
				return nil, err
			}
		}
		return run, stopChain()
	}
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
	run.Samples = during(samples, run.T0, loadEnd)
	if err != nil {
		return nil, fmt.Errorf("waiting for the chain to catch up: %w", err)
	}
	if err := stopChain(); err != nil {
		return nil, err
	}
	if err := readLatencies(ctx, opool, npool, run); err != nil {
		return nil, err
	}
	// The notifier's backends have exited, so their statistics are flushed.
	if err := npool.QueryRow(ctx, `SELECT
			coalesce((SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'email_send_pending_due_idx'), 0),
			(SELECT count(*) FROM email_send WHERE state = 'sent')`).Scan(&run.Claims, &run.Sent); err != nil {
		return nil, fmt.Errorf("read the sender's claims: %w", err)
	}
	return run, nil
}

// warmUp sends one order through the whole chain and waits until its
// email is sent: the load then starts on a chain that is running (the
// relay owns its partitions, the consumer has joined its group, the sender
// has its SMTP connection), as a service under a steady stream is, rather
// than on processes still starting. The latencies count only the events
// created after it (readLatencies).
func warmUp(ctx context.Context, timeout time.Duration, base string, npool *pgxpool.Pool, procs []*proc) error {
	client := newClient(1)
	defer client.CloseIdleConnections()
	if !postOrder(ctx, client, base+"/orders") {
		return fmt.Errorf("warm-up: the first order was not created")
	}
	err := waitFor(ctx, timeout, 20*time.Millisecond, procs, func(ctx context.Context) (bool, error) {
		var sent bool
		err := npool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM email_send WHERE state = 'sent')").Scan(&sent)
		return sent, err
	})
	if err != nil {
		return fmt.Errorf("warm-up: the first order's email: %w", err)
	}
	return nil
}

// during keeps the samples taken between from and to.
func during(samples []lagSample, from, to time.Time) []lagSample {
	var out []lagSample
	for _, s := range samples {
		if s.At.After(from) && !s.At.After(to) {
			out = append(out, s)
		}
	}
	return out
}

// readLatencies reads, per event, commit → broker ack from the outbox and
// commit → applied from the notifier's inbox.
func readLatencies(ctx context.Context, opool, npool *pgxpool.Pool, run *chainRun) error {
	created := map[uuid.UUID]time.Time{}
	rows, err := opool.Query(ctx, "SELECT event_id, created_at, delivered_at FROM outbox WHERE state = 'delivered' AND created_at >= $1", run.T0)
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
		run.Ack = append(run.Ack, sample{At: c, MS: ms(d.Sub(c))})
	}
	if err := rows.Err(); err != nil {
		return err
	}
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
			run.Applied = append(run.Applied, sample{At: c, MS: ms(p.Sub(c))})
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(run.Ack) == 0 || len(run.Applied) == 0 {
		return fmt.Errorf("no event went through the chain (%d delivered, %d applied)", len(run.Ack), len(run.Applied))
	}
	return nil
}

// latencyScenario runs the whole chain under a fixed request rate and
// measures, per event, commit to broker acknowledgement and commit to
// applied by the notifier.
func (b *bench) latencyScenario(ctx context.Context) error {
	const sc = "latency"
	run, err := b.runChain(ctx, "latency", b.opts.Rate, b.opts.LatencyDuration, true)
	if err != nil {
		return err
	}
	b.addPeaks(sc, run.Peaks)
	b.reportLatency(sc, "", run, latencyTargets{Ack: "<= 20 ms", Applied: "<= 100 ms"})
	return nil
}

// latencyTargets are the targets of one latency report.
type latencyTargets struct{ Ack, Applied string }

// reportLatency adds a chain run's request rate, latencies and lags to the
// report, each figure's name starting with prefix.
func (b *bench) reportLatency(sc, prefix string, run *chainRun, t latencyTargets) {
	load := run.Load
	httpMS := make([]float64, len(load.Latencies))
	for i, s := range load.Latencies {
		httpMS[i] = s.MS
	}
	httpSum := summarize(httpMS)
	ref, refV := "POST /orders p99", httpSum.P99
	rate := float64(run.Rate)
	b.rep.add(result{Scenario: sc, Figure: prefix + fmt.Sprintf("orders created at %d/s requested (open loop)", run.Rate), Value: run.reached(), Unit: "orders/s",
		Reference: "requested rate", RefValue: rate, Target: "ratio >= 0.99",
		Note: fmt.Sprintf("%d sent, %d failed, %d dropped (more than 2,000 waiting) over %s; POST /orders latency counts from each request's scheduled time", load.Sent, load.Failed, load.Dropped, load.Duration.Round(time.Millisecond))})
	b.rep.add(result{Scenario: sc, Figure: prefix + "POST /orders p50", Value: httpSum.P50, Unit: "ms"})
	b.rep.add(result{Scenario: sc, Figure: prefix + "POST /orders p99", Value: httpSum.P99, Unit: "ms"})

	// The figures with targets count the events committed after the
	// settling period, which the capacity steps' lags leave out too; the
	// load generator is also still opening its connections then. The
	// settling period's p99 is reported on its own row.
	settle := settlingPeriod(load.Duration)
	from := run.T0.Add(settle)
	addLatency := func(what string, all []sample, target string, note string) {
		var s, early []float64
		var steady []sample
		for _, x := range all {
			if x.At.Before(from) {
				early = append(early, x.MS)
				continue
			}
			steady = append(steady, x)
			s = append(s, x.MS)
		}
		sum := summarize(s)
		note = fmt.Sprintf("%s; %d events committed after the first %s of the load", note, sum.N, settle)
		win := windowP99(steady, from, 5*time.Second)
		worst := 0.0
		var ws []string
		for _, w := range win {
			worst = max(worst, w)
			ws = append(ws, formatValue(w, ""))
		}
		b.rep.add(result{Scenario: sc, Figure: prefix + what + " p50", Value: sum.P50, Unit: "ms", Reference: ref, RefValue: refV})
		b.rep.add(result{Scenario: sc, Figure: prefix + what + " p99", Value: sum.P99, Unit: "ms", Reference: ref, RefValue: refV, Target: target,
			Note: note})
		b.rep.add(result{Scenario: sc, Figure: prefix + what + " max", Value: sum.Max, Unit: "ms", Reference: ref, RefValue: refV})
		b.rep.add(result{Scenario: sc, Figure: prefix + what + " worst 5 s p99", Value: worst, Unit: "ms", Reference: ref, RefValue: refV, Target: target,
			Note: what + ", p99 of each 5 s window of commit times after the settling period (ms): " + strings.Join(ws, " ")})
		if len(early) > 0 {
			slices.Sort(early)
			b.rep.add(result{Scenario: sc, Figure: prefix + what + " p99 while settling", Value: percentile(early, 99), Unit: "ms", Reference: ref, RefValue: refV,
				Note: fmt.Sprintf("the %d events committed in the first %s of the load, left out of the figures above", len(early), settle)})
		}
	}
	addLatency("commit→broker ack", run.Ack, t.Ack,
		"outbox delivered_at (the confirm, after the broker's ack) minus created_at (the insert in the order's transaction, just before its commit)")
	addLatency("commit→applied", run.Applied, t.Applied,
		"notifier processed_event.processed_at (the inbox marker, written in the batch transaction before its commit) minus outbox created_at")

	if run.Sent > 0 {
		b.rep.add(result{Scenario: sc, Figure: prefix + "sender claims per email sent", Value: float64(run.Claims) / float64(run.Sent), Unit: "claims",
			Note: fmt.Sprintf("scans of email_send_pending_due_idx (one per claim, including those that find nothing) over the run, %d, for %d emails sent", run.Claims, run.Sent)})
	}
	if len(run.Samples) == 0 {
		return
	}
	lag := run.series(func(s lagSample) int64 { return s.Unapplied })
	pend := run.series(func(s lagSample) int64 { return s.Pending })
	behind := run.series(func(s lagSample) int64 { return s.Behind })
	unsent := run.series(func(s lagSample) int64 { return s.Unsent })
	lagSum, pendSum := summarize(lag), summarize(pend)
	b.rep.add(result{Scenario: sc, Figure: prefix + "unapplied events, max of 1 s samples", Value: lagSum.Max, Unit: "events",
		Reference: "one second of load", RefValue: rate, Target: "ratio <= 0.1",
		Note: fmt.Sprintf("each second during the load: outbox rows minus the notifier's inbox markers (unapplied) and pending outbox rows; unapplied p50 %s, pending p50 %s max %s",
			formatValue(lagSum.P50, ""), formatValue(pendSum.P50, ""), formatValue(pendSum.Max, ""))})
	b.rep.add(result{Scenario: sc, Figure: prefix + "unapplied events, trend", Value: slope(lag), Unit: "events/s",
		Reference: "requested rate", RefValue: rate, Target: fmt.Sprintf("flat: |ratio| <= %.2f", flatFraction),
		Note: "least-squares slope of the unapplied samples over the load: positive means the chain falls behind"})
	behindSum := summarize(behind)
	b.rep.add(result{Scenario: sc, Figure: prefix + "notifier lag (delivered, not applied), max", Value: behindSum.Max, Unit: "events",
		Reference: "one second of load", RefValue: rate, Target: "ratio <= 0.1",
		Note: fmt.Sprintf("the notifier's own lag, without the relay's: delivered outbox rows minus inbox markers, each second during the load; p50 %s", formatValue(behindSum.P50, ""))})
	b.rep.add(result{Scenario: sc, Figure: prefix + "notifier lag, trend", Value: slope(behind), Unit: "events/s",
		Reference: "requested rate", RefValue: rate, Target: fmt.Sprintf("flat: |ratio| <= %.2f", flatFraction)})
	b.rep.add(result{Scenario: sc, Figure: prefix + "unsent emails, trend", Value: slope(unsent), Unit: "emails/s",
		Reference: "requested rate", RefValue: rate, Target: fmt.Sprintf("flat: |ratio| <= %.2f", flatFraction),
		Note: fmt.Sprintf("ledger rows pending or sending, each second during the load; max %s", formatValue(summarize(unsent).Max, ""))})
}

// addPeaks reports the peak resident set of each process of a run.
func (b *bench) addPeaks(sc string, peaks []procPeak) {
	for _, p := range peaks {
		if p.Peak <= 0 {
			continue
		}
		r := result{Scenario: sc, Figure: "peak RSS " + p.Name, Value: p.Peak, Unit: "MiB", Target: "< 100 MiB"}
		if p.Idle > 0 {
			r.Reference, r.RefValue = "RSS when ready", p.Idle
		}
		if p.Name == "devbroker" {
			r.Target = "- (holds the topic in memory)"
		}
		b.rep.add(r)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
