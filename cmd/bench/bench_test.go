package main

import (
	"bufio"
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPercentileNearestRank(t *testing.T) {
	vals := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	assert.Equal(t, 5.0, percentile(vals, 50))
	assert.Equal(t, 10.0, percentile(vals, 99))
	assert.Equal(t, 10.0, percentile(vals, 100))
	assert.Equal(t, 1.0, percentile(vals, 1))
	assert.Equal(t, 0.0, percentile(nil, 50))
	assert.Equal(t, 7.0, percentile([]float64{7}, 99))

	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(i + 1)
	}
	assert.Equal(t, 99.0, percentile(hundred, 99))
	assert.Equal(t, 50.0, percentile(hundred, 50))
}

func TestSummarizeDoesNotReorderItsInput(t *testing.T) {
	in := []float64{30, 10, 20}
	s := summarize(in)
	assert.Equal(t, summary{N: 3, P50: 20, P99: 30, Max: 30}, s)
	assert.Equal(t, []float64{30, 10, 20}, in)
	assert.Equal(t, summary{}, summarize(nil))
}

func TestWindowP99(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(sec float64, ms float64) sample {
		return sample{At: start.Add(time.Duration(sec * float64(time.Second))), MS: ms}
	}
	got := windowP99([]sample{at(0, 1), at(1, 3), at(4.9, 2), at(12, 9), at(-1, 4)}, start, 5*time.Second)
	// A sample before the start counts in the first window; the empty
	// window between is 0.
	assert.Equal(t, []float64{4, 0, 9}, got)
	assert.Nil(t, windowP99(nil, start, 5*time.Second))
}

func TestSlope(t *testing.T) {
	assert.InDelta(t, 2.0, slope([]float64{1, 3, 5, 7}), 1e-9)
	assert.InDelta(t, 0.0, slope([]float64{4, 4, 4}), 1e-9)
	assert.InDelta(t, -1.0, slope([]float64{3, 2, 1}), 1e-9)
	assert.Equal(t, 0.0, slope([]float64{5}))
}

func TestFormatValue(t *testing.T) {
	for _, c := range []struct {
		v    float64
		unit string
		want string
	}{
		{1234567, "events/s", "1,234,567 events/s"},
		{9500.4, "", "9,500"},
		{42.25, "ms", "42.2 ms"},
		{3.14159, "ms", "3.14 ms"},
		{-1500, "", "-1,500"},
		{0, "rows", "0 rows"},
		{999, "", "999"},
	} {
		assert.Equal(t, c.want, formatValue(c.v, c.unit), "%v", c.v)
	}
	assert.Equal(t, "-", formatRatio(0))
	assert.Equal(t, "0.93", formatRatio(0.9251))
}

func TestWriteTable(t *testing.T) {
	rep := &report{}
	rep.add(result{Scenario: "relay", Figure: "drain", Value: 9000, Unit: "events/s",
		Reference: "SQL loop", RefValue: 10000, Target: "ratio >= 0.9", Note: "how it was timed"})
	rep.add(result{Scenario: "api", Figure: "p99", Value: 12.5, Unit: "ms"})
	rep.Failures = []string{"notifier: boom"}
	var buf bytes.Buffer
	require.NoError(t, writeTable(&buf, rep))
	lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
	require.Len(t, lines, 5)
	assert.Equal(t, []string{"scenario", "figure", "value", "reference", "ratio", "target"}, strings.Fields(lines[0]))
	assert.Contains(t, lines[1], "drain [1]")
	assert.Contains(t, lines[1], "9,000 events/s")
	assert.Contains(t, lines[1], "SQL loop = 10,000 events/s")
	assert.Contains(t, lines[1], "0.90")
	assert.Contains(t, lines[1], "ratio >= 0.9")
	// The columns line up: every row's value starts where the header's does.
	col := strings.Index(lines[0], "value")
	assert.Equal(t, "9,000", lines[1][col:col+5])
	assert.Equal(t, "12.5", lines[2][col:col+4])
	assert.Equal(t, "[1] how it was timed", lines[3])
	assert.Equal(t, "FAILED: notifier: boom", lines[4])
	assert.InDelta(t, 0.9, rep.Results[0].Ratio, 1e-9)
	assert.Equal(t, 0.0, rep.Results[1].Ratio)
}

func TestParseArgs(t *testing.T) {
	o, err := parseArgs([]string{"all"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, scenarioNames, o.Scenarios)
	assert.Equal(t, 200000, o.Backlog)
	assert.Equal(t, 30*time.Second, o.APIDuration)
	assert.Equal(t, 32, o.Conns)
	assert.Equal(t, 1000, o.Rate)
	assert.Equal(t, 1000000, o.RecoveryBacklog)
	assert.Equal(t, defaultRelayBatch, o.batchSize())
	assert.Equal(t, []int{defaultRelayBatch, 500}, o.relayBatches())
	assert.True(t, o.Watermill, "the relay scenario drains with Watermill too unless told not to")

	o, err = parseArgs([]string{"-tiny", "-backlog", "1000", "notifier", "relay", "relay"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []string{"notifier", "relay"}, o.Scenarios)
	assert.Equal(t, 1000, o.Backlog, "an explicit flag wins over -tiny")
	assert.Less(t, o.NotifierBacklog, 200000)
	assert.Less(t, o.LatencyDuration, 60*time.Second)

	o, err = parseArgs([]string{"-relay-batch", "500", "relay"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 500, o.batchSize())
	assert.Equal(t, []int{500}, o.relayBatches())

	for _, bad := range [][]string{{}, {"nope"}, {"-rate", "0", "latency"}, {"-api-duration", "0s", "api"}, {"-relay-batch", "-1", "relay"}} {
		_, err := parseArgs(bad, io.Discard)
		assert.Error(t, err, "%q", bad)
	}
	_, err = parseArgs([]string{"-h"}, io.Discard)
	assert.ErrorIs(t, err, errHelp)
}

func TestParseWrk(t *testing.T) {
	out := `Running 30s test @ http://127.0.0.1:4000/orders
  2 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    10.01ms    3.00ms  80.00ms   90.00%
  95000 requests in 30.01s, 40.00MB read
  Socket errors: connect 0, read 1, write 0, timeout 2
  Non-2xx or 3xx responses: 7
Requests/sec:   3165.61
`
	r, err := parseWrk(out)
	require.NoError(t, err)
	assert.Equal(t, int64(94990), r.OK)
	assert.Equal(t, int64(10), r.Other)
	assert.Equal(t, 30010*time.Millisecond, r.Duration)

	_, err = parseWrk("nothing useful")
	assert.Error(t, err)
}

func TestPgbenchTPS(t *testing.T) {
	out := []byte("number of transactions actually processed: 1000\nlatency average = 3.2 ms\ntps = 2345.678901 (without initial connection time)\n")
	tps, err := pgbenchTPS(out)
	require.NoError(t, err)
	assert.InDelta(t, 2345.678901, tps, 1e-6)
	_, err = pgbenchTPS([]byte("error"))
	assert.Error(t, err)
}

func TestParseStatusField(t *testing.T) {
	status := "Name:\torders\nVmPeak:\t  900000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t   40960 kB\n"
	assert.Equal(t, 50.0, parseStatusField(bufio.NewScanner(strings.NewReader(status)), "VmHWM"))
	assert.Equal(t, 40.0, parseStatusField(bufio.NewScanner(strings.NewReader(status)), "VmRSS"))
	assert.Equal(t, 0.0, parseStatusField(bufio.NewScanner(strings.NewReader(status)), "VmSwap"))
}

func TestGroupThousands(t *testing.T) {
	assert.Equal(t, "1", groupThousands("1"))
	assert.Equal(t, "1,000", groupThousands("1000"))
	assert.Equal(t, "12,345,678", groupThousands("12345678"))
	assert.Equal(t, "-100,000", groupThousands("-100000"))
}

func TestParseCPU(t *testing.T) {
	m := parseProcStat("cpu  100 5 50 800 20 3 2 0 0 0\ncpu0 1 2 3 4\nintr 5 6\nctxt 123456\nbtime 1\n")
	assert.Equal(t, 160.0, m.busy)
	assert.Equal(t, 980.0, m.total)
	assert.Equal(t, 55.0, m.kernel, "system, irq and softirq")
	assert.Equal(t, 123456.0, m.switches)
	assert.Equal(t, machineStat{}, parseProcStat("garbage"))
	assert.Equal(t, 42.0, parsePidStat("1234 (orders serve) S 1 1234 1234 0 -1 4194560 100 0 0 0 30 12 0 0 20 0 8"))
	assert.Equal(t, 0.0, parsePidStat("garbage"))
}

func TestJudgeStep(t *testing.T) {
	flat := []float64{10, 12, 9, 11, 10, 12, 10, 11, 9, 10}
	growing := []float64{0, 50, 100, 150, 200, 250, 300, 350, 400, 450} // 50/s
	v := judgeStep(1000, 995, stepLags{Pending: flat, Unapplied: flat, Unsent: flat})
	assert.True(t, v.KeepsUp, v.Reasons)
	assert.Empty(t, v.Reasons)

	// 50/s is above 1% of 1,000/s and grows by 450 events, more than a
	// quarter second of load: behind.
	v = judgeStep(1000, 1000, stepLags{Pending: flat, Unapplied: growing, Unsent: flat})
	assert.False(t, v.KeepsUp)
	assert.Equal(t, []string{"unapplied grows 50.0/s"}, v.Reasons)
	// The same growth at 10,000/s is under 1% of the rate: flat.
	assert.True(t, judgeStep(10000, 10000, stepLags{Pending: flat, Unapplied: growing, Unsent: flat}).KeepsUp)

	// Each lag counts, not only the unapplied events.
	assert.False(t, judgeStep(1000, 1000, stepLags{Pending: growing, Unapplied: flat, Unsent: flat}).KeepsUp)
	assert.False(t, judgeStep(1000, 1000, stepLags{Pending: flat, Unapplied: flat, Unsent: growing}).KeepsUp)

	// A short step whose lag rises by a batch (2 events at 30/s, under a
	// quarter second of load) is not behind, though its slope is 3% of
	// the rate.
	assert.True(t, judgeStep(30, 30, stepLags{Pending: []float64{0, 1, 2}, Unapplied: []float64{0, 1, 2}, Unsent: []float64{0, 0, 0}}).KeepsUp)

	// The load must reach the asked rate within 3%.
	v = judgeStep(1000, 960, stepLags{Pending: flat, Unapplied: flat, Unsent: flat})
	assert.False(t, v.KeepsUp)
	assert.Equal(t, []string{"reached 960/s of 1000/s"}, v.Reasons)
	assert.True(t, judgeStep(1000, 971, stepLags{Pending: flat, Unapplied: flat, Unsent: flat}).KeepsUp)

	// No samples, no verdict of keeping up.
	assert.False(t, judgeStep(1000, 1000, stepLags{Pending: flat, Unapplied: []float64{1}, Unsent: flat}).KeepsUp)
	assert.False(t, judgeStep(0, 0, stepLags{}).KeepsUp)
}

// runStepper drives a stepper against a chain that keeps up with any
// rate up to capacity and returns the rates it tried.
func runStepper(s *stepper, capacity int) []int {
	var rates []int
	for {
		r, ok := s.next()
		if !ok {
			return rates
		}
		rates = append(rates, r)
		s.record(r, r <= capacity)
	}
}

func TestStepperSearch(t *testing.T) {
	// API max 2,000/s: start at 500, up by 200 until 1,100 fails, then
	// halve the interval between 900 and 1,100 down to 50 (inc/4).
	s := newStepper(2000, 20)
	assert.Equal(t, []int{500, 700, 900, 1100, 1000, 950}, runStepper(s, 960))
	assert.Equal(t, 950, s.capacity())
	good, bad := s.bounds()
	assert.Equal(t, 950, good)
	assert.Equal(t, 1000, bad)

	// A chain that keeps up with everything stops at the API's maximum.
	s = newStepper(1000, 20)
	assert.Equal(t, []int{250, 350, 450, 550, 650, 750, 850, 950, 1000}, runStepper(s, 5000))
	assert.Equal(t, 1000, s.capacity())

	// The first step failing searches downwards from it.
	s = newStepper(2000, 20)
	assert.Equal(t, []int{500, 250, 375, 312, 281}, runStepper(s, 300))
	assert.Equal(t, 281, s.capacity())

	// Nothing keeps up: capacity 0 once the steps run out.
	s = newStepper(2000, 3)
	assert.Equal(t, []int{500, 250, 125}, runStepper(s, 0))
	assert.Equal(t, 0, s.capacity())

	// At most maxSteps steps.
	s = newStepper(2000, 2)
	assert.Equal(t, []int{500, 700}, runStepper(s, 5000))
	assert.Equal(t, 700, s.capacity())
}

func TestStepperIgnoresANoisyPassAboveAFailure(t *testing.T) {
	s := newStepper(1000, 20)
	s.record(250, true)
	s.record(350, false)
	s.record(450, true) // noise: above a failure, it does not raise the capacity
	good, bad := s.bounds()
	assert.Equal(t, 250, good)
	assert.Equal(t, 350, bad)
	r, ok := s.next()
	require.True(t, ok)
	assert.Equal(t, 300, r)
}

func TestLagsAfterWarmup(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var samples []lagSample
	for i := 1; i <= 10; i++ {
		samples = append(samples, lagSample{At: t0.Add(time.Duration(i) * time.Second), Pending: int64(i), Unapplied: int64(10 * i), Unsent: int64(100 * i)})
	}
	// A 10 s step drops its first 2 s.
	l := lagsAfterWarmup(samples, t0, 10*time.Second)
	assert.Equal(t, []float64{2, 3, 4, 5, 6, 7, 8, 9, 10}, l.Pending)
	assert.Equal(t, 20.0, l.Unapplied[0])
	assert.Equal(t, 200.0, l.Unsent[0])
	// A 60 s step drops at most 5 s.
	l = lagsAfterWarmup(samples, t0, 60*time.Second)
	assert.Equal(t, []float64{5, 6, 7, 8, 9, 10}, l.Pending)
}

func TestPostgresGroup(t *testing.T) {
	run := "123_456"
	assert.Equal(t, pgBackends, postgresGroup("postgres: 15/main: postgres bench_123_456_cap1_orders_3 127.0.0.1(5000) idle", run))
	assert.Equal(t, pgBackends, postgresGroup("postgres: 15/main: autovacuum worker bench_123_456_cap1_orders_3", run))
	assert.Equal(t, pgBackground, postgresGroup("postgres: 15/main: checkpointer ", run))
	assert.Equal(t, pgBackground, postgresGroup("postgres: walwriter", run))
	assert.Equal(t, pgBackground, postgresGroup("/usr/lib/postgresql/15/bin/postgres\x00-D\x00/var/lib/postgresql/15/main\x00", run))
	// Anyone else's backend, including another run's, is left out.
	assert.Equal(t, "", postgresGroup("postgres: 15/main: postgres bench_999_456_cap1_orders_3 127.0.0.1(5000) idle", run))
	assert.Equal(t, "", postgresGroup("postgres: 15/main: postgres orders_test 127.0.0.1(5001) idle", run))
}

func TestCoresString(t *testing.T) {
	c := cores{Machine: 1.5, Kernel: 0.6, Switches: 18250, Procs: map[string]float64{"orders serve": 0.5, "devbroker": 0.125}}
	assert.Equal(t, "machine 1.50 cores busy, 0.60 in the kernel, 18,250 context switches/s (devbroker 0.12, orders serve 0.50)", c.String())
	cpu, switches := c.perEvent(500)
	assert.Equal(t, 3.0, cpu, "ms of CPU per event")
	assert.Equal(t, 36.5, switches)
	cpu, switches = c.perEvent(0)
	assert.Zero(t, cpu)
	assert.Zero(t, switches)
}

func TestJudgeStepAbsoluteNoise(t *testing.T) {
	// At 20/s a lag rising by 8 events over a short step is within the
	// absolute allowance of 10 events, though more than a quarter second
	// of load; 12 events is not.
	quiet := []float64{0, 0, 0}
	assert.True(t, judgeStep(20, 20, stepLags{Pending: quiet, Unapplied: []float64{0, 4, 8}, Unsent: quiet}).KeepsUp)
	assert.False(t, judgeStep(20, 20, stepLags{Pending: quiet, Unapplied: []float64{0, 6, 12}, Unsent: quiet}).KeepsUp)
}
