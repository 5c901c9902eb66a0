package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// orderBody is the body of every POST /orders: one line, like the SQL
// reference's transaction.
const orderBody = `{"email":"bench@example.com","currency":"EUR","items":[{"sku":"BOOK-1","quantity":2,"unit_price_cents":1250}]}`

// loadResult is what a closed-loop load run measured.
type loadResult struct {
	Tool     string
	OK       int64 // 201 responses
	Other    int64 // any other response or error
	Duration time.Duration
	CPU      cores // the cores the machine and the services kept busy meanwhile
}

func (r loadResult) rate() float64 { return float64(r.OK) / r.Duration.Seconds() }

// wrkScript posts orderBody with the bench customer's token.
const wrkScript = `wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer ` + customerToken + `"
wrk.body = '` + orderBody + `'
`

// closedLoad runs conns clients posting orders back to back for d, with
// wrk when it is installed and the built-in generator otherwise.
// wrk's CPU is added to meter.
func (b *bench) closedLoad(ctx context.Context, meter *cpuMeter, base string, conns int, d time.Duration) (loadResult, error) {
	if path, err := exec.LookPath("wrk"); err == nil {
		return b.wrkLoad(ctx, meter, path, base, conns, d)
	}
	return goLoad(ctx, base, conns, d)
}

var (
	wrkRequestsRE = regexp.MustCompile(`(\d+) requests in ([0-9.]+)(us|ms|s|m)`)
	wrkNon2xxRE   = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
	wrkErrorsRE   = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
)

func (b *bench) wrkLoad(ctx context.Context, meter *cpuMeter, wrk, base string, conns int, d time.Duration) (loadResult, error) {
	script := filepath.Join(b.dir, "post-order.lua")
	if err := os.WriteFile(script, []byte(wrkScript), 0o644); err != nil {
		return loadResult{}, err
	}
	threads := min(2, conns)
	cmd := exec.CommandContext(ctx, wrk, "-t"+strconv.Itoa(threads), "-c"+strconv.Itoa(conns),
		"-d"+strconv.Itoa(max(1, int(d.Seconds())))+"s", "-s", script, base+"/orders")
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		return loadResult{}, fmt.Errorf("wrk: %w", err)
	}
	meter.add("wrk", cmd.Process.Pid)
	// Stop the meter while wrk is still there to be read.
	time.Sleep(d)
	cpu := meter.stop()
	err := cmd.Wait()
	out := buf.Bytes()
	if err != nil {
		return loadResult{}, fmt.Errorf("wrk: %w\n%s", err, out)
	}
	res, err := parseWrk(string(out))
	res.Tool = fmt.Sprintf("wrk -t%d -c%d", threads, conns)
	res.CPU = cpu
	return res, err
}

// parseWrk reads the request count, duration and failures from wrk's
// report. Every request that is not a 2xx counts as a failure.
func parseWrk(out string) (loadResult, error) {
	m := wrkRequestsRE.FindStringSubmatch(out)
	if m == nil {
		return loadResult{}, fmt.Errorf("wrk output without a request count:\n%s", out)
	}
	total, _ := strconv.ParseInt(m[1], 10, 64)
	v, _ := strconv.ParseFloat(m[2], 64)
	unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second, "m": time.Minute}[m[3]]
	res := loadResult{Duration: time.Duration(v * float64(unit))}
	var bad int64
	if m := wrkNon2xxRE.FindStringSubmatch(out); m != nil {
		bad, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := wrkErrorsRE.FindStringSubmatch(out); m != nil {
		for _, s := range m[1:] {
			n, _ := strconv.ParseInt(s, 10, 64)
			bad += n
		}
	}
	res.OK, res.Other = total-min(bad, total), bad
	return res, nil
}

// newClient is an HTTP client keeping up to conns connections open.
func newClient(conns int) *http.Client {
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns: conns, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns,
			IdleConnTimeout: time.Minute,
		},
	}
}

// postOrder sends one order and reports whether it was created.
func postOrder(ctx context.Context, client *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(orderBody))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+customerToken)
	res, err := client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode == http.StatusCreated
}

// goLoad is the built-in closed-loop generator: conns workers, each on a
// kept-alive connection, posting back to back until d has passed.
func goLoad(ctx context.Context, base string, conns int, d time.Duration) (loadResult, error) {
	client := newClient(conns)
	defer client.CloseIdleConnections()
	url := base + "/orders"
	var ok, other atomic.Int64
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			for ctx.Err() == nil {
				if postOrder(ctx, client, url) {
					ok.Add(1)
				} else if ctx.Err() == nil {
					other.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return loadResult{Tool: fmt.Sprintf("built-in Go generator, %d connections (wrk not installed)", conns),
		OK: ok.Load(), Other: other.Load(), Duration: time.Since(start)}, nil
}

// openResult is what an open-loop run measured: the latency of each
// request from the time it was due, so a stalled server is not hidden by
// requests that were never sent.
type openResult struct {
	Sent, OK, Failed, Dropped int64
	Latencies                 []sample
	Duration                  time.Duration
}

// openLoad sends POST /orders at a fixed rate for d, each request at its
// scheduled time whatever the previous ones are doing. At most maxInFlight
// requests wait at once; beyond that a request is counted as dropped.
func openLoad(ctx context.Context, base string, rate int, d time.Duration) openResult {
	const maxInFlight = 2000
	client := newClient(256)
	defer client.CloseIdleConnections()
	url := base + "/orders"
	interval := time.Second / time.Duration(rate)
	total := int(d / interval)
	var res openResult
	var mu sync.Mutex
	var inFlight atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < total && ctx.Err() == nil; i++ {
		due := start.Add(time.Duration(i) * interval)
		if w := time.Until(due); w > 0 {
			time.Sleep(w)
		}
		if inFlight.Load() >= maxInFlight {
			res.Dropped++
			continue
		}
		res.Sent++
		inFlight.Add(1)
		wg.Go(func() {
			defer inFlight.Add(-1)
			ok := postOrder(ctx, client, url)
			ms := float64(time.Since(due)) / float64(time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			if ok {
				res.OK++
				res.Latencies = append(res.Latencies, sample{At: due, MS: ms})
			} else {
				res.Failed++
			}
		})
	}
	wg.Wait()
	res.Duration = time.Since(start)
	return res
}

// pgbenchTPS reads the throughput from pgbench's report.
func pgbenchTPS(out []byte) (float64, error) {
	for _, line := range bytes.Split(out, []byte("\n")) {
		s := string(line)
		if strings.HasPrefix(s, "tps = ") {
			f := strings.Fields(s)
			if len(f) >= 3 {
				return strconv.ParseFloat(f[2], 64)
			}
		}
	}
	return 0, fmt.Errorf("pgbench output without tps:\n%s", out)
}
