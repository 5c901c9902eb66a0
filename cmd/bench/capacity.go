package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"
)

// A step of the capacity search keeps up when every lag stays flat and
// the load reached the asked rate within reachTolerance. A lag is flat
// when its least-squares slope, per second, is at most flatFraction of
// the asked rate, or when it grows over the whole step by no more than
// lagNoise seconds of load or lagNoiseEvents events (batching and polling
// make a short step's lag jump by that much without falling behind).
const (
	flatFraction   = 0.01
	reachTolerance = 0.03
	lagNoise       = 0.25
	lagNoiseEvents = 10
)

// stepLags are a step's lag series, one sample a second during the load.
type stepLags struct {
	Pending   []float64 // outbox rows not yet delivered
	Unapplied []float64 // outbox rows minus the notifier's inbox markers
	Unsent    []float64 // emails pending or being sent
}

// stepVerdict is the judgement of one step.
type stepVerdict struct {
	KeepsUp bool
	Reasons []string // why it does not keep up
}

// judgeStep decides whether the chain kept up with rate: the creates
// reached it within reachTolerance and no lag grew by more than
// flatFraction of the rate per second.
func judgeStep(rate int, reached float64, lags stepLags) stepVerdict {
	var v stepVerdict
	if rate <= 0 {
		return stepVerdict{Reasons: []string{"no rate"}}
	}
	if reached < float64(rate)*(1-reachTolerance) {
		v.Reasons = append(v.Reasons, fmt.Sprintf("reached %.0f/s of %d/s", reached, rate))
	}
	for _, l := range []struct {
		name string
		ys   []float64
	}{{"pending", lags.Pending}, {"unapplied", lags.Unapplied}, {"unsent", lags.Unsent}} {
		if len(l.ys) < 2 {
			v.Reasons = append(v.Reasons, l.name+": too few samples")
			continue
		}
		s := slope(l.ys)
		growth := s * float64(len(l.ys)-1)
		if s > flatFraction*float64(rate) && growth > max(lagNoise*float64(rate), lagNoiseEvents) {
			v.Reasons = append(v.Reasons, fmt.Sprintf("%s grows %.1f/s", l.name, s))
		}
	}
	v.KeepsUp = len(v.Reasons) == 0
	return v
}

// stepper chooses the rates of the capacity search: from start up by inc
// while the chain keeps up (not beyond limit), then halving the interval
// between the highest rate that kept up and the lowest that did not until
// it is at most inc/4, in at most maxSteps steps.
type stepper struct {
	start, inc, limit, maxSteps int
	tried                       []stepOutcome
}

type stepOutcome struct {
	Rate    int
	KeepsUp bool
}

// newStepper starts at a quarter of the API's maximum and steps by a
// tenth of it, never beyond it.
func newStepper(apiMax float64, maxSteps int) *stepper {
	inc := max(1, int(math.Round(apiMax/10)))
	return &stepper{start: max(1, int(math.Round(apiMax/4))), inc: inc, limit: max(1, int(apiMax)), maxSteps: maxSteps}
}

func (s *stepper) record(rate int, keepsUp bool) {
	s.tried = append(s.tried, stepOutcome{rate, keepsUp})
}

// bounds are the highest rate that kept up below the lowest that did not
// (0 when none did), and that lowest failure (0 when none failed).
func (s *stepper) bounds() (good, bad int) {
	for _, t := range s.tried {
		if !t.KeepsUp && (bad == 0 || t.Rate < bad) {
			bad = t.Rate
		}
	}
	for _, t := range s.tried {
		if t.KeepsUp && t.Rate > good && (bad == 0 || t.Rate < bad) {
			good = t.Rate
		}
	}
	return good, bad
}

// next returns the next rate to try, or false when the search is over.
func (s *stepper) next() (int, bool) {
	if len(s.tried) == 0 {
		return min(s.start, s.limit), true
	}
	if len(s.tried) >= s.maxSteps {
		return 0, false
	}
	good, bad := s.bounds()
	if bad == 0 {
		r := good + s.inc
		if good >= s.limit {
			return 0, false
		}
		return min(r, s.limit), true
	}
	if bad-good <= max(1, s.inc/4) {
		return 0, false
	}
	return (good + bad) / 2, true
}

// capacity is the highest rate that kept up below every failure.
func (s *stepper) capacity() int {
	good, _ := s.bounds()
	return good
}

// capacityScenario measures the API's own maximum (relay and notifier
// off), then steps the open-loop create rate through the whole chain to
// find the highest rate it keeps up with, and measures latency at half
// and at 80% of that.
func (b *bench) capacityScenario(ctx context.Context) error {
	const sc = "capacity"
	api, err := b.apiRun(ctx, sc, false)
	if err != nil {
		return err
	}
	apiMax := api.rate()
	b.logf("API alone: %.0f orders/s (%s; %s)", apiMax, api.Tool, api.CPU)
	b.dropDatabases(ctx)

	st := newStepper(apiMax, b.opts.CapacitySteps)
	peaks := map[string]procPeak{}
	keepPeaks := func(run *chainRun) {
		for _, p := range run.Peaks {
			if p.Peak > peaks[p.Name].Peak {
				peaks[p.Name] = p
			}
		}
	}
	cpuAt := map[int]cores{}
	for i := 1; ; i++ {
		rate, ok := st.next()
		if !ok || ctx.Err() != nil {
			break
		}
		run, err := b.runChain(ctx, fmt.Sprintf("cap%d", i), rate, b.opts.CapacityStep, false)
		if err != nil {
			return fmt.Errorf("step at %d/s: %w", rate, err)
		}
		b.dropDatabases(ctx)
		keepPeaks(run)
		lags := lagsAfterWarmup(run.Samples, run.T0, b.opts.CapacityStep)
		v := judgeStep(rate, run.reached(), lags)
		st.record(rate, v.KeepsUp)
		cpuAt[rate] = run.CPU
		verdict := "keeps up"
		if !v.KeepsUp {
			verdict = "falls behind: " + strings.Join(v.Reasons, "; ")
		}
		b.logf("step %d at %d/s (%.0f%% of the API's maximum): %s", i, rate, 100*float64(rate)/apiMax, verdict)
		short := "keeps up"
		if !v.KeepsUp {
			short = "falls behind"
		}
		b.rep.add(result{Scenario: sc, Figure: fmt.Sprintf("step %d: %d/s asked, %s", i, rate, short), Value: run.reached(), Unit: "orders/s",
			Reference: "asked", RefValue: float64(rate), Target: fmt.Sprintf("ratio >= %.2f", 1-reachTolerance),
			Note: fmt.Sprintf("step %d, %s: %s; lag slopes per second: pending %.1f, unapplied %.1f, unsent emails %.1f (flat: <= %.0f); max unapplied %.0f, max unsent %.0f; %s",
				i, b.opts.CapacityStep, verdict, slope(lags.Pending), slope(lags.Unapplied), slope(lags.Unsent), flatFraction*float64(rate),
				summarize(lags.Unapplied).Max, summarize(lags.Unsent).Max, run.CPU)})
	}
	capRate := st.capacity()
	good, bad := st.bounds()
	b.rep.add(result{Scenario: sc, Figure: "chain capacity", Value: float64(capRate), Unit: "orders/s",
		Reference: "API alone (relay, notifier off)", RefValue: apiMax, Target: "ratio >= 0.5",
		Note: fmt.Sprintf("highest open-loop create rate at which the whole chain kept up for %s (every lag flat after the first fifth of the step: slope <= %.0f%% of the rate, or growth over the step <= %.2f s of load or %d events; creates within %.0f%% of the rate), searched from 25%% of the API's maximum in steps of 10%%, then by halving; first rate that fell behind: %s; API alone: %s for %s",
			b.opts.CapacityStep, 100*flatFraction, lagNoise, lagNoiseEvents, 100*reachTolerance, rateOrNone(bad), api.Tool, b.opts.APIDuration)})
	if c, ok := cpuAt[good]; ok && good > 0 {
		b.rep.add(result{Scenario: sc, Figure: "cores busy at capacity", Value: c.Machine, Unit: "cores",
			Reference: "cores", RefValue: float64(b.rep.Host.CPUs), Note: "at the capacity step: " + c.String()})
		b.addCores(sc, "at capacity: ", c)
		b.addCostPerOrder(sc, c, float64(good), api.CPU, apiMax)
	}
	b.rep.add(result{Scenario: sc, Figure: "cores busy, API alone", Value: api.CPU.Machine, Unit: "cores",
		Reference: "cores", RefValue: float64(b.rep.Host.CPUs), Note: "API alone: " + api.CPU.String()})
	// The latency runs take the capacity as their base. When no rate kept
	// up (a finding, not a failure of the tool: the table shows it), they
	// take the lowest rate tried instead and say so.
	base, of := capRate, "capacity"
	if capRate == 0 {
		for _, t := range st.tried {
			if base == 0 || t.Rate < base {
				base = t.Rate
			}
		}
		of = fmt.Sprintf("%d/s (none kept up)", base)
		b.logf("the chain kept up at no rate tried: latency at 50%% and 80%% of the lowest, %d/s", base)
	}

	for _, at := range []struct {
		frac    float64
		label   string
		targets latencyTargets
	}{
		{0.5, "50%", latencyTargets{Ack: "<= 20 ms", Applied: "<= 100 ms"}},
		{0.8, "80%", latencyTargets{Ack: "< 1,000 ms", Applied: "< 1,000 ms"}},
	} {
		rate := max(1, int(math.Round(at.frac*float64(base))))
		run, err := b.runChain(ctx, "cap_latency", rate, b.opts.CapacityStep, true)
		if err != nil {
			return fmt.Errorf("latency at %s of capacity: %w", at.label, err)
		}
		b.dropDatabases(ctx)
		keepPeaks(run)
		b.reportLatency(sc, fmt.Sprintf("at %s of %s: ", at.label, of), run, at.targets)
	}
	b.addPeaks(sc, peakList(peaks))
	return nil
}

// addCostPerOrder reports what one order cost the whole machine at the
// chain's capacity step against what it cost when the API ran alone at its
// maximum. With every process on one host the chain can keep up with at
// most 1/r of the API's maximum when it costs r times the API's CPU per
// order, so a capacity of 0.5 needs r <= 2. The context switches and the
// kernel's share show how much of that cost is events handed from one
// process to the next rather than work on them.
func (b *bench) addCostPerOrder(sc string, chain cores, rate float64, api cores, apiRate float64) {
	chainCPU, chainSwitches := chain.perEvent(rate)
	apiCPU, apiSwitches := api.perEvent(apiRate)
	b.rep.add(result{Scenario: sc, Figure: "CPU per order at capacity", Value: chainCPU, Unit: "ms",
		Reference: "API alone, at its maximum", RefValue: apiCPU, Target: "ratio <= 2 for a capacity of 0.5",
		Note: "the cores the whole machine kept busy divided by the orders per second, every process of the chain on this host included"})
	b.rep.add(result{Scenario: sc, Figure: "context switches per order at capacity", Value: chainSwitches, Unit: "switches",
		Reference: "API alone, at its maximum", RefValue: apiSwitches, Target: "-",
		Note: "the machine's context switches per second (/proc/stat ctxt) divided by the orders per second"})
	b.rep.add(result{Scenario: sc, Figure: "kernel's share of the busy cores at capacity", Value: chain.Kernel, Unit: "cores",
		Reference: "machine busy", RefValue: chain.Machine, Target: "-",
		Note: fmt.Sprintf("system time and interrupts; API alone: %.2f of %.2f busy cores", api.Kernel, api.Machine)})
}

// settlingPeriod is the start of a chain run left out of its verdicts and
// latency figures: its first fifth, at most 5 s, while the just-started
// services open their pools and prepare their statements.
func settlingPeriod(run time.Duration) time.Duration { return min(run/5, 5*time.Second) }

// lagsAfterWarmup returns a step's lag series without the samples of its
// settling period.
func lagsAfterWarmup(samples []lagSample, t0 time.Time, step time.Duration) stepLags {
	from := t0.Add(settlingPeriod(step))
	var l stepLags
	for _, s := range samples {
		if s.At.Before(from) {
			continue
		}
		l.Pending = append(l.Pending, float64(s.Pending))
		l.Unapplied = append(l.Unapplied, float64(s.Unapplied))
		l.Unsent = append(l.Unsent, float64(s.Unsent))
	}
	return l
}

func rateOrNone(r int) string {
	if r == 0 {
		return "none"
	}
	return fmt.Sprintf("%d/s", r)
}

// peakList orders the highest peaks of each process by name.
func peakList(m map[string]procPeak) []procPeak {
	var out []procPeak
	for _, name := range []string{"orders serve", "notifier serve", "devbroker"} {
		if p, ok := m[name]; ok {
			out = append(out, p)
		}
	}
	return out
}
