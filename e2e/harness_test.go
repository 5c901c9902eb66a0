package e2e

// Helpers for the long-running proofs (soak, scale-out, disaster recovery):
// services that are killed and restarted under the same address, a client
// that keeps driving orders while the API comes and goes, and checks that
// compare the topic, the outbox and the notifier's tables.
//
// Everything here that runs in a goroutine other than the test's returns
// errors instead of calling t.Fatal, which must only be called from the
// test goroutine.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/pgtest"
	"github.com/outboxref/orders/internal/testlog"
)

// Application names the services connect with, so that a test can
// terminate their database sessions and leave its own alone.
const (
	appOrders   = "e2e-orders"
	appNotifier = "e2e-notifier"
)

// withAppName adds application_name to a PostgreSQL URL.
func withAppName(url, name string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "application_name=" + name
}

// service is one binary that a test kills and restarts. Every incarnation
// runs with the same environment, so the same HTTP_ADDR, and writes to one
// log that is printed when the test fails.
type service struct {
	t        *testing.T
	label    string
	bin      string
	args     []string
	env      map[string]string
	readyURL string
	out      testlog.Buffer

	mu     sync.Mutex
	cur    *proc
	starts int
	kills  int
}

// newService describes a service; nothing runs until start. When the test
// ends the running incarnation is stopped gracefully.
func newService(t *testing.T, label, bin string, env map[string]string, readyURL string, args ...string) *service {
	s := &service{t: t, label: label, bin: bin, args: args, env: env, readyURL: readyURL}
	t.Cleanup(func() {
		s.mu.Lock()
		p := s.cur
		s.mu.Unlock()
		if p != nil {
			p.stop(t)
		}
		if t.Failed() {
			starts, kills := s.counts()
			t.Logf("---- %s output (%d starts, %d kills) ----\n%s", label, starts, kills, tail(s.out.String(), 8000))
		}
	})
	return s
}

// start runs a new incarnation and returns once it answers its readiness
// URL. It may be called from any goroutine.
func (s *service) start(ctx context.Context) error {
	s.mu.Lock()
	if s.cur != nil {
		select {
		case <-s.cur.done:
		default:
			s.mu.Unlock()
			return fmt.Errorf("%s: start while an incarnation is running", s.label)
		}
	}
	s.starts++
	fmt.Fprintf(&s.out, "==== %s start #%d at %s ====\n", s.label, s.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(filepath.Join(binDir, s.bin), s.args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range s.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = &s.out, &s.out
	p := &proc{name: s.label, cmd: cmd, out: &s.out, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("%s: start: %w", s.label, err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	s.cur = p
	s.mu.Unlock()
	return waitReadyErr(ctx, p, s.readyURL, 60*time.Second)
}

// kill ends the running incarnation with SIGKILL and waits for it to exit.
func (s *service) kill() error {
	s.mu.Lock()
	p := s.cur
	s.kills++
	fmt.Fprintf(&s.out, "==== %s SIGKILL at %s ====\n", s.label, time.Now().Format(time.RFC3339Nano))
	s.mu.Unlock()
	if p == nil {
		return fmt.Errorf("%s: nothing to kill", s.label)
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("%s: kill: %w", s.label, err)
	}
	<-p.done
	return nil
}

// stop ends the running incarnation gracefully (SIGTERM) and waits for it.
func (s *service) stop() {
	s.mu.Lock()
	p := s.cur
	s.mu.Unlock()
	if p != nil {
		p.stop(s.t)
	}
}

func (s *service) counts() (starts, kills int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts, s.kills
}

// waitReadyErr is waitReady for any goroutine: it polls url until it
// answers 200, the process exits, ctx ends or the timeout passes.
func waitReadyErr(ctx context.Context, p *proc, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if res, err := client.Get(url); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not become ready within %s", p.name, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
			return fmt.Errorf("%s exited during start-up", p.name)
		case <-tick.C:
		}
	}
}

// scrapeMetric adds up the series of a metric family whose labels contain
// every one of labels (e.g. `state="skipped"`). Unlike metricSum it
// returns an error, so goroutines can use it.
func scrapeMetric(url, name string, labels ...string) (float64, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	res, err := client.Get(url)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		match := true
		for _, l := range labels {
			match = match && strings.Contains(line, l)
		}
		if !match {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += v
	}
	return sum, nil
}

// notifierEnv is the notifier's configuration in these tests: short
// timeouts so that a killed sender's row is judged within the test, and a
// capped retry backoff so that retries after an outage come back quickly.
func notifierEnv(db *pgtest.DB, addr, broker, smtpAddr, ordersBase, group string) map[string]string {
	return map[string]string{
		"DATABASE_URL":          withAppName(db.URL, appNotifier),
		"HTTP_ADDR":             addr,
		"KAFKA_BROKERS":         broker,
		"ORDERS_TOPIC":          topic,
		"KAFKA_GROUP":           group,
		"KAFKA_INSTANCE_ID":     group + "-1", // static membership: a restart takes over at once
		"KAFKA_SESSION_TIMEOUT": "6s",         // kfake's minimum
		"SMTP_ADDR":             smtpAddr,
		"SMTP_TIMEOUT":          "5s",
		"EMAIL_SENDING_TIMEOUT": "10s", // at least twice SMTP_TIMEOUT
		"EMAIL_POLL_INTERVAL":   "100ms",
		"EMAIL_BACKOFF_BASE":    "100ms",
		"EMAIL_BACKOFF_CAP":     "1s",
		"ORDERS_API_URL":        ordersBase,
		"ORDERS_API_TOKEN":      "dev-notifier",
		"GAP_WINDOW":            "2s",
		"SHUTDOWN_TIMEOUT":      "15s",
	}
}

// databaseName returns the name of the database a pool is connected to.
func databaseName(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var name string
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT current_database()").Scan(&name))
	return name
}

// terminateBackends ends every session of the databases opened under one
// of the application names, as a failover or an administrator would, and
// returns how many it ended. The test's own sessions have no such name.
func terminateBackends(ctx context.Context, admin *pgxpool.Pool, databases, appNames []string) (int, error) {
	var n int
	err := admin.QueryRow(ctx,
		`SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		 FROM pg_stat_activity
		 WHERE datname = ANY($1) AND application_name = ANY($2) AND pid <> pg_backend_pid()`, databases, appNames).Scan(&n)
	return n, err
}

// adminPool connects to the server's maintenance database.
func adminPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.ServerURL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// envInt reads a positive integer setting of a long run, or returns def.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err, "%s", name)
	require.Positive(t, n, "%s", name)
	return n
}

// seedFrom reads a seed from the environment, or makes one from the
// clock, and prints it so that a failing run can be repeated.
func seedFrom(t *testing.T, name string) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(name); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "%s", name)
	}
	t.Logf("%s=%d (set it to repeat this run's plans and fault schedule)", name, seed)
	return seed
}

// ---- A client that keeps going while the API is killed ----

// ordersClient calls the orders API on one or more instances, taking them
// in turn, one attempt per call: retrying is the caller's decision, because
// only the caller knows whether a lost answer can be retried blindly.
type ordersClient struct {
	bases []string
	http  *http.Client
	next  atomic.Uint64
}

func newOrdersClient(bases ...string) *ordersClient {
	return &ordersClient{bases: bases, http: &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 32, IdleConnTimeout: 30 * time.Second},
	}}
}

type reply struct {
	status     int
	body       map[string]any
	replayed   bool
	retryAfter string
}

func (c *ordersClient) do(ctx context.Context, method, path, token string, header map[string]string, body []byte) (reply, error) {
	base := c.bases[int(c.next.Add(1))%len(c.bases)]
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer res.Body.Close()
	r := reply{status: res.StatusCode, replayed: res.Header.Get("Idempotent-Replayed") == "true", retryAfter: res.Header.Get("Retry-After")}
	if err := json.NewDecoder(res.Body).Decode(&r.body); err != nil && r.status < 500 {
		// A process killed mid-answer cuts the body: that is a lost answer.
		return reply{}, fmt.Errorf("read answer: %w", err)
	}
	return r, nil
}

// plan is how far a driven order goes: the commands after its create.
type plan []string

func (p plan) String() string {
	if len(p) == 0 {
		return "placed"
	}
	return strings.Join(p, "+")
}

// statusAfter is the order status each command leads to.
var statusAfter = map[string]string{"pay": "paid", "ship": "shipped", "cancel": "cancelled"}

// mixedPlans is the load's mix: some orders stay placed, some are paid,
// shipped, or cancelled before or after payment (the last emits two events
// in one transaction: order.cancelled and order.refund_requested).
var mixedPlans = []struct {
	plan   plan
	weight int
}{
	{plan{}, 15},
	{plan{"pay"}, 20},
	{plan{"pay", "ship"}, 25},
	{plan{"cancel"}, 15},
	{plan{"pay", "cancel"}, 25},
}

// pickPlan chooses order n's plan from the seed alone, so a seed repeats
// the same mix whatever the timing.
func pickPlan(seed uint64, n int) plan {
	r := rand.New(rand.NewPCG(seed, uint64(n)))
	total := 0
	for _, p := range mixedPlans {
		total += p.weight
	}
	x := r.IntN(total)
	for _, p := range mixedPlans {
		if x < p.weight {
			return p.plan
		}
		x -= p.weight
	}
	panic("unreachable")
}

// confirmation is an answer the API gave: 201 for a create, 200 for a
// command, with the order version it named.
type confirmation struct {
	orderID string
	command string // create, pay, ship or cancel
	version int64
}

// driverStats counts what the clients went through.
type driverStats struct {
	requests, transportErrors, serverErrors, stale, illegal, rereads, replays atomic.Int64
	// The 5xx answers by kind: 503 unavailable with Retry-After (nothing
	// was committed), 500 commit-unknown, and anything else, which a lost
	// database session should never cause.
	unavailable, commitUnknown, unexplained atomic.Int64
	sampleUnexplained                       atomic.Pointer[string]
}

func (s *driverStats) String() string {
	return fmt.Sprintf("%d requests, %d without an answer, %d 5xx (%d unavailable, %d commit-unknown, %d other), %d 412, %d 409, %d re-reads, %d idempotent replays",
		s.requests.Load(), s.transportErrors.Load(), s.serverErrors.Load(), s.unavailable.Load(), s.commitUnknown.Load(), s.unexplained.Load(),
		s.stale.Load(), s.illegal.Load(), s.rereads.Load(), s.replays.Load())
}

// countServerError sorts a 5xx answer by its problem type.
func (s *driverStats) countServerError(r reply) {
	s.serverErrors.Add(1)
	switch typ, _ := r.body["type"].(string); {
	case r.status == http.StatusServiceUnavailable && typ == "urn:outboxref:problem:unavailable" && r.retryAfter != "":
		s.unavailable.Add(1)
	case r.status == http.StatusInternalServerError && typ == "urn:outboxref:problem:commit-unknown":
		s.commitUnknown.Add(1)
	default:
		s.unexplained.Add(1)
		sample := fmt.Sprintf("%d %v (Retry-After %q)", r.status, r.body, r.retryAfter)
		s.sampleUnexplained.Store(&sample)
	}
}

// driver takes orders through their plans against an API that may be
// down, keeping the answers it got. It never trusts its own view over the
// database: a command whose answer was lost may or may not have committed,
// so after any doubt it reads the order again and carries on from there.
type driver struct {
	c     *ordersClient
	runID string // makes emails and idempotency keys unique per run
	stats driverStats

	mu        sync.Mutex
	confirmed []confirmation

	completed atomic.Int64
	progress  chan struct{} // signalled after each completed order
}

func newDriver(c *ordersClient, runID string) *driver {
	return &driver{c: c, runID: runID, progress: make(chan struct{}, 1)}
}

func (d *driver) email(n int) string { return fmt.Sprintf("o%d-%s@example.com", n, d.runID) }

func (d *driver) confirm(c confirmation) {
	d.mu.Lock()
	d.confirmed = append(d.confirmed, c)
	d.mu.Unlock()
}

func (d *driver) confirmations() []confirmation {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.confirmed)
}

// run drives orders 0..n-1 with the given number of concurrent workers and
// returns the first error. Plans come from the seed.
func (d *driver) run(ctx context.Context, n, workers int, seed uint64) error {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		errs = make(chan error, workers)
	)
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := d.drive(ctx, i, pickPlan(seed, i)); err != nil {
					errs <- fmt.Errorf("order %d: %w", i, err)
					return
				}
				d.completed.Add(1)
				select {
				case d.progress <- struct{}{}:
				default:
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// waitCompleted blocks until at least n orders were driven to the end of
// their plans, or ctx ends.
func (d *driver) waitCompleted(ctx context.Context, n int) error {
	for int(d.completed.Load()) < n {
		select {
		case <-d.progress:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

type orderState struct {
	id      string
	status  string
	version int64
}

func stateOf(body map[string]any) (orderState, error) {
	id, _ := body["id"].(string)
	status, _ := body["status"].(string)
	v, _ := body["version"].(float64)
	if id == "" || status == "" || v < 1 {
		return orderState{}, fmt.Errorf("not an order: %v", body)
	}
	return orderState{id: id, status: status, version: int64(v)}, nil
}

// pause is the back-off between attempts while the API is down or
// restarting. There is no condition to wait on from here (the next request
// is the check), so a short jittered wait keeps clients from spinning.
func pause(ctx context.Context) error {
	t := time.NewTimer(time.Duration(20+rand.IntN(60)) * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func customerToken(n int) string {
	if n%2 == 0 {
		return "dev-alice"
	}
	return "dev-bob"
}

// drive creates order n (retrying with one Idempotency-Key, so a retry
// after a lost answer returns the order the first attempt created) and
// takes it through its plan.
func (d *driver) drive(ctx context.Context, n int, p plan) error {
	token := customerToken(n)
	body, err := json.Marshal(newOrder(d.email(n)))
	if err != nil {
		return err
	}
	key := map[string]string{"Idempotency-Key": fmt.Sprintf("%s-%d", d.runID, n)}
	var st orderState
	for {
		d.stats.requests.Add(1)
		r, err := d.c.do(ctx, http.MethodPost, "/orders", token, key, body)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil && r.status == http.StatusCreated {
			if st, err = stateOf(r.body); err != nil {
				return err
			}
			if r.replayed {
				d.stats.replays.Add(1)
			}
			d.confirm(confirmation{orderID: st.id, command: "create", version: st.version})
			break
		}
		if err := d.doubt(ctx, r, err); err != nil {
			return fmt.Errorf("create: %w", err)
		}
	}

	statuses := append([]string{"placed"}, mapSlice(p, func(c string) string { return statusAfter[c] })...)
	for {
		i := slices.Index(statuses, st.status)
		if i < 0 {
			return fmt.Errorf("order %s is %s, which plan %s never reaches", st.id, st.status, p)
		}
		if i == len(p) {
			return nil
		}
		cmd := p[i]
		tok := token
		if cmd == "ship" {
			tok = "dev-ops" // only admins ship
		}
		d.stats.requests.Add(1)
		r, err := d.c.do(ctx, http.MethodPost, "/orders/"+st.id+"/"+cmd, tok,
			map[string]string{"If-Match": `"` + strconv.FormatInt(st.version, 10) + `"`}, nil)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil && r.status == http.StatusOK {
			if st, err = stateOf(r.body); err != nil {
				return err
			}
			d.confirm(confirmation{orderID: st.id, command: cmd, version: st.version})
			continue
		}
		switch {
		case err == nil && r.status == http.StatusPreconditionFailed:
			d.stats.stale.Add(1)
		case err == nil && r.status == http.StatusConflict:
			d.stats.illegal.Add(1)
		default:
			if err := d.doubt(ctx, r, err); err != nil {
				return fmt.Errorf("%s: %w", cmd, err)
			}
		}
		// A lost answer may hide a commit (412 or 409 say so): carry on
		// from what the database holds.
		if st, err = d.read(ctx, st.id, token); err != nil {
			return err
		}
	}
}

// doubt accounts for an attempt that got no usable answer and pauses
// before the next one. It returns an error for answers that retrying
// cannot change.
func (d *driver) doubt(ctx context.Context, r reply, err error) error {
	switch {
	case err != nil:
		d.stats.transportErrors.Add(1)
	case r.status >= 500:
		d.stats.countServerError(r)
	case r.status == http.StatusTooManyRequests:
		d.stats.serverErrors.Add(1)
	default:
		return fmt.Errorf("unexpected answer %d: %v", r.status, r.body)
	}
	return pause(ctx)
}

// read returns the order as the database holds it, retrying until the API
// answers.
func (d *driver) read(ctx context.Context, id, token string) (orderState, error) {
	d.stats.rereads.Add(1)
	for {
		d.stats.requests.Add(1)
		r, err := d.c.do(ctx, http.MethodGet, "/orders/"+id, token, nil, nil)
		if ctx.Err() != nil {
			return orderState{}, ctx.Err()
		}
		if err == nil && r.status == http.StatusOK {
			return stateOf(r.body)
		}
		if err := d.doubt(ctx, r, err); err != nil {
			return orderState{}, fmt.Errorf("read %s: %w", id, err)
		}
	}
}

func mapSlice[T, U any](in []T, f func(T) U) []U {
	out := make([]U, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

// ---- Checks against the outbox and the topic ----

// outboxEvent is an outbox row with what the topic checks compare.
type outboxEvent struct {
	outboxRow
	payload    []byte
	errorClass *string
	partition  *int32
}

func outboxEvents(t *testing.T, pool *pgxpool.Pool) []outboxEvent {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT event_id, aggregate_id, aggregate_version, event_type, state, payload::text, last_error_class, broker_partition
		 FROM outbox ORDER BY aggregate_id, aggregate_version`)
	require.NoError(t, err)
	defer rows.Close()
	var out []outboxEvent
	for rows.Next() {
		var e outboxEvent
		var payload string
		require.NoError(t, rows.Scan(&e.eventID, &e.aggregateID, &e.version, &e.eventType, &e.state, &payload, &e.errorClass, &e.partition))
		e.payload = []byte(payload)
		out = append(out, e)
	}
	require.NoError(t, rows.Err())
	return out
}

// readTopicToEnd returns every record on the topic, all partitions from
// the start up to the end offsets at the time of the call, in partition
// and offset order. Unlike readTopic it does not stop at the first copy of
// each event, so re-sends are counted exactly.
func readTopicToEnd(t *testing.T, broker string) []record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	require.NoError(t, err)
	require.NoError(t, ends.Error())
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	var out []record
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "reading the topic to its end offsets; %d partitions not done", len(want))
		fs.EachError(func(_ string, _ int32, err error) { require.NoError(t, err) })
		fs.EachRecord(func(r *kgo.Record) {
			h := map[string]string{}
			for _, kv := range r.Headers {
				h[kv.Key] = string(kv.Value)
			}
			out = append(out, record{key: string(r.Key), value: r.Value, headers: h, raw: r})
			if end, ok := want[r.Partition]; ok && r.Offset+1 >= end {
				delete(want, r.Partition)
			}
		})
	}
	slices.SortFunc(out, func(a, b record) int {
		if a.raw.Partition != b.raw.Partition {
			return int(a.raw.Partition - b.raw.Partition)
		}
		return int(a.raw.Offset - b.raw.Offset)
	})
	return out
}

// checkTopicAgainstOutbox checks that every event in want is on the topic,
// and that every record is an outbox event carrying the key, type, version
// and payload it was written with (its identity never changes on the way).
// It returns how many copies of each event the topic holds.
func checkTopicAgainstOutbox(t *testing.T, records []record, events []outboxEvent, want map[uuid.UUID]bool) map[uuid.UUID]int {
	t.Helper()
	byID := map[uuid.UUID]outboxEvent{}
	for _, e := range events {
		byID[e.eventID] = e
	}
	copies := map[uuid.UUID]int{}
	for _, rec := range records {
		id, err := uuid.Parse(rec.headers["ce_id"])
		require.NoError(t, err, "record at %d@%d has no event id", rec.raw.Partition, rec.raw.Offset)
		e, ok := byID[id]
		require.True(t, ok, "the topic holds an event the outbox never had: %s", id)
		require.Equal(t, e.aggregateID, rec.key, "key of %s", id)
		require.Equal(t, e.aggregateID, rec.headers["ce_subject"], "ce_subject of %s", id)
		require.Equal(t, strconv.FormatInt(e.version, 10), rec.headers["ce_aggregateversion"], "version of %s", id)
		require.Equal(t, e.eventType, rec.headers["ce_type"], "type of %s", id)
		if copies[id] == 0 {
			var a, b any
			require.NoError(t, json.Unmarshal(e.payload, &a))
			require.NoError(t, json.Unmarshal(rec.value, &b), "value of %s is not JSON", id)
			require.True(t, reflect.DeepEqual(a, b), "payload of %s changed on the way:\noutbox %s\ntopic  %s", id, e.payload, rec.value)
		}
		copies[id]++
	}
	for id := range want {
		require.Positive(t, copies[id], "event %s (%s v%d of %s) is not on the topic",
			id, byID[id].eventType, byID[id].version, byID[id].aggregateID)
	}
	return copies
}

// checkAggregateOrder checks R6 on the topic for strict types (every order
// event type is strict): all records of an aggregate are in one partition,
// and the first copy of each version comes after the first copy of the
// version before it. A later copy of an older version (a re-send after a
// lost acknowledgement) is allowed; it returns how many there were.
func checkAggregateOrder(t *testing.T, records []record) (lateCopies int) {
	t.Helper()
	type agg struct {
		partition int32
		max       int64
		seen      map[int64]bool
	}
	aggs := map[string]*agg{}
	for _, rec := range records { // partition, then offset order
		v, err := strconv.ParseInt(rec.headers["ce_aggregateversion"], 10, 64)
		require.NoError(t, err)
		a := aggs[rec.key]
		if a == nil {
			a = &agg{partition: rec.raw.Partition, seen: map[int64]bool{}}
			aggs[rec.key] = a
		}
		require.Equal(t, a.partition, rec.raw.Partition, "aggregate %s is spread over partitions", rec.key)
		switch {
		case a.seen[v]:
			lateCopies++
		case v == a.max+1:
			a.seen[v], a.max = true, v
		default:
			require.Failf(t, "per-aggregate order broken",
				"aggregate %s: first copy of v%d at %d@%d follows v%d (want v%d next)", rec.key, v, rec.raw.Partition, rec.raw.Offset, a.max, a.max+1)
		}
	}
	return lateCopies
}

// waitFor checks a condition every tick until it holds, and fails the test
// after the timeout with the state the last check described.
// require.Eventually would format its message before the first check, so
// it could only report the state as it was at the start.
func waitFor(t *testing.T, timeout, tick time.Duration, what string, check func() (done bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	for {
		done, state := check()
		if done {
			return
		}
		if time.Now().After(deadline) {
			require.Failf(t, "condition not met within "+timeout.String(), "%s; last seen: %s", what, state)
		}
		<-ticker.C
	}
}

// waitNoPending waits until the outbox holds no pending row and
// returns how long that took. Parked rows are left to the caller.
func waitNoPending(t *testing.T, pool *pgxpool.Pool, timeout time.Duration) time.Duration {
	t.Helper()
	began := time.Now()
	waitFor(t, timeout, 200*time.Millisecond, "every outbox row leaves pending", func() (bool, string) {
		var pending int
		err := pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE state = 'pending'").Scan(&pending)
		return err == nil && pending == 0, fmt.Sprintf("%d pending (error: %v)", pending, err)
	})
	return time.Since(began)
}

// errorList collects errors from goroutines for one report.
type errorList struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorList) add(err error) {
	if err == nil {
		return
	}
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
}

func (l *errorList) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return errors.Join(l.errs...)
}
