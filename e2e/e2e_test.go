// Package e2e runs the real binaries against real PostgreSQL, a Kafka
// wire-protocol broker (kfake, in this test process) and an SMTP server,
// and checks the promises the whole chain makes: no committed event is
// lost when the orders process is killed with SIGKILL, every event reaches
// the topic with its identity unchanged, and redelivered events send no
// second email.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/notify"
	"github.com/outboxref/orders/internal/notify/smtptest"
	"github.com/outboxref/orders/internal/pgtest"
	"github.com/outboxref/orders/internal/testlog"
)

const (
	topic     = "orders.events"
	devTokens = "dev-alice=alice:customer,dev-bob=bob:customer,dev-ops=ops:admin,dev-notifier=notifier:service"
)

var binDir string

// TestMain builds the binaries once for every test in the package, with
// failpoints compiled in.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outboxref-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The failpoints tag compiles in the crash points that FAILPOINTS arms
	// (package failpoint); a normal build has none (TestNoFailpointsInNormalBuild).
	build := exec.Command("go", "build", "-tags", "failpoints", "-o", dir+string(os.PathSeparator), "../cmd/orders", "../cmd/notifier")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build binaries:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is one running binary whose output is kept for failure reports.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *testlog.Buffer
	done chan struct{}
}

// start runs one of the binaries TestMain built, or (name is an absolute
// path) another program, such as the demo's Mailpit.
func start(t *testing.T, name string, env map[string]string, args ...string) *proc {
	t.Helper()
	bin := filepath.Join(binDir, name)
	if filepath.IsAbs(name) {
		bin, name = name, filepath.Base(name)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &proc{name: name, cmd: cmd, out: &testlog.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	require.NoError(t, cmd.Start())
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("---- %s output ----\n%s", name, tail(p.out.String(), 6000))
		}
	})
	return p
}

// stop asks for a graceful shutdown and waits for it.
func (p *proc) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Errorf("%s did not stop within 20s of SIGTERM", p.name)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// kill ends the process with SIGKILL: no deferred code, no shutdown hooks.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.done
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

func waitReady(t *testing.T, p *proc, url string) {
	t.Helper()
	require.Eventually(t, func() bool {
		select {
		case <-p.done:
			t.Fatalf("%s exited during start-up:\n%s", p.name, p.out.String())
		default:
		}
		res, err := http.Get(url)
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, "%s did not become ready", p.name)
}

func newBroker(t *testing.T) string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(6, topic))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c.ListenAddrs()[0]
}

func ordersDB(t *testing.T) *pgtest.DB {
	t.Helper()
	return pgtest.New(t, schema.Orders()...)
}

func notifierDB(t *testing.T) *pgtest.DB {
	t.Helper()
	return pgtest.New(t, schema.Notifier()...)
}

func ordersEnv(db *pgtest.DB, httpAddr, broker string) map[string]string {
	return map[string]string{
		"DATABASE_URL":        db.URL,
		"HTTP_ADDR":           httpAddr,
		"AUTH_TOKENS":         devTokens,
		"KAFKA_BROKERS":       broker,
		"ORDERS_TOPIC":        topic,
		"RELAY_LEASE":         "3s",
		"RELAY_POLL_INTERVAL": "200ms",
		"SHUTDOWN_TIMEOUT":    "10s",
	}
}

// api is a small client for the orders API.
type api struct {
	base  string
	token string
	http  *http.Client
}

func (a api) call(method, path, ifMatch string, body any) (int, map[string]any, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, a.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Content-Type", "application/json")
	if ifMatch != "" {
		req.Header.Set("If-Match", ifMatch)
	}
	res, err := a.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(res.Body).Decode(&m)
	return res.StatusCode, m, nil
}

func newOrder(email string) map[string]any {
	return map[string]any{"email": email, "currency": "EUR",
		"items": []any{map[string]any{"sku": "BOOK-1", "quantity": 1, "unit_price_cents": 1999}}}
}

// record is a consumed Kafka record reduced to what the checks need.
type record struct {
	key     string
	value   []byte
	headers map[string]string
	raw     *kgo.Record
}

// readTopic returns every record on the topic (all partitions, from the
// start) once the set of ce_ids covers want, or fails after the timeout.
func readTopic(t *testing.T, broker string, want map[uuid.UUID]bool) []record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	var out []record
	seen := map[uuid.UUID]bool{}
	deadline := time.Now().Add(60 * time.Second)
	for len(seen) < len(want) || !covers(seen, want) {
		if time.Now().After(deadline) {
			t.Fatalf("topic holds %d of the %d expected events", countIn(seen, want), len(want))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			h := map[string]string{}
			for _, kv := range r.Headers {
				h[kv.Key] = string(kv.Value)
			}
			out = append(out, record{key: string(r.Key), value: r.Value, headers: h, raw: r})
			if id, err := uuid.Parse(h["ce_id"]); err == nil {
				seen[id] = true
			}
		})
	}
	return out
}

func covers(seen, want map[uuid.UUID]bool) bool { return countIn(seen, want) == len(want) }

func countIn(seen, want map[uuid.UUID]bool) int {
	n := 0
	for id := range want {
		if seen[id] {
			n++
		}
	}
	return n
}

type outboxRow struct {
	eventID     uuid.UUID
	aggregateID string
	version     int64
	eventType   string
	state       string
}

func outboxRows(t *testing.T, pool *pgxpool.Pool) []outboxRow {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		"SELECT event_id, aggregate_id, aggregate_version, event_type, state FROM outbox ORDER BY aggregate_id, aggregate_version")
	require.NoError(t, err)
	defer rows.Close()
	var out []outboxRow
	for rows.Next() {
		var r outboxRow
		require.NoError(t, rows.Scan(&r.eventID, &r.aggregateID, &r.version, &r.eventType, &r.state))
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestOrdersProcessKilledMidTraffic kills the orders process (API and
// relay) with SIGKILL while clients are creating and paying orders, then
// restarts it. Every event whose transaction committed reaches the topic
// at least once, with the event_id and aggregate version it was written
// with; every order the API confirmed has its order.placed event.
func TestOrdersProcessKilledMidTraffic(t *testing.T) {
	t.Parallel()
	broker := newBroker(t)
	db := ordersDB(t)
	addr := freeAddr(t)
	env := ordersEnv(db, addr, broker)
	client := api{base: "http://" + addr, token: "dev-alice", http: &http.Client{Timeout: 5 * time.Second}}

	orders := start(t, "orders", env, "serve")
	waitReady(t, orders, client.base+"/readyz")

	var (
		mu        sync.Mutex
		confirmed []string
		wg        sync.WaitGroup
	)
	stop := make(chan struct{})
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				status, body, err := client.call("POST", "/orders", "", newOrder(fmt.Sprintf("c%d-%d@example.com", w, i)))
				if err != nil || status != http.StatusCreated {
					time.Sleep(20 * time.Millisecond) // the server is down; do not spin
					continue
				}
				id := body["id"].(string)
				mu.Lock()
				confirmed = append(confirmed, id)
				mu.Unlock()
				if i%2 == 0 {
					_, _, _ = client.call("POST", "/orders/"+id+"/pay", `"1"`, nil)
				}
			}
		}()
	}
	enough := func(n int) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return len(confirmed) >= n }
	}
	require.Eventually(t, enough(40), 30*time.Second, 10*time.Millisecond)
	orders.kill(t)

	restarted := start(t, "orders", env, "serve")
	waitReady(t, restarted, client.base+"/readyz")
	mu.Lock()
	before := len(confirmed)
	mu.Unlock()
	require.Eventually(t, enough(before+20), 30*time.Second, 10*time.Millisecond)
	close(stop)
	wg.Wait()

	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE state <> 'delivered'").Scan(&n))
		return n == 0
	}, 60*time.Second, 100*time.Millisecond, "every committed event is delivered after the restart")

	rows := outboxRows(t, db.Pool)
	placed := map[string]bool{}
	want := map[uuid.UUID]bool{}
	byID := map[uuid.UUID]outboxRow{}
	for _, r := range rows {
		want[r.eventID] = true
		byID[r.eventID] = r
		if r.eventType == "order.placed" {
			placed[r.aggregateID] = true
		}
	}
	mu.Lock()
	for _, id := range confirmed {
		require.True(t, placed[id], "order %s was confirmed with 201 but has no order.placed event", id)
	}
	mu.Unlock()

	records := readTopic(t, broker, want)
	for _, rec := range records {
		id := uuid.MustParse(rec.headers["ce_id"])
		row, ok := byID[id]
		require.True(t, ok, "the topic holds an event the outbox never had: %s", id)
		require.Equal(t, row.aggregateID, rec.key)
		require.Equal(t, strconv.FormatInt(row.version, 10), rec.headers["ce_aggregateversion"])
		require.Equal(t, row.eventType, rec.headers["ce_type"])
	}
	t.Logf("%d orders confirmed, %d events, %d records on the topic (%d re-sends)",
		len(confirmed), len(rows), len(records), len(records)-len(rows))
}

// TestChainSendsOneEmailPerEvent runs orders, relay and notifier together:
// creating, paying and cancelling an order sends exactly three emails, each
// with a Message-ID derived from its event id; order.refund_requested only
// updates the projection. Re-producing the order's records unchanged sends
// nothing new and counts one inbox duplicate per record.
func TestChainSendsOneEmailPerEvent(t *testing.T) {
	t.Parallel()
	broker := newBroker(t)
	odb, ndb := ordersDB(t), notifierDB(t)
	smtp := smtptest.Start(t)
	ordersAddr, notifierAddr := freeAddr(t), freeAddr(t)

	orders := start(t, "orders", ordersEnv(odb, ordersAddr, broker), "serve")
	waitReady(t, orders, "http://"+ordersAddr+"/readyz")
	notifier := start(t, "notifier", map[string]string{
		"DATABASE_URL":          ndb.URL,
		"HTTP_ADDR":             notifierAddr,
		"KAFKA_BROKERS":         broker,
		"ORDERS_TOPIC":          topic,
		"KAFKA_GROUP":           "notifier-e2e",
		"KAFKA_INSTANCE_ID":     "notifier-e2e-1",
		"KAFKA_SESSION_TIMEOUT": "6s",
		"SMTP_ADDR":             smtp.Addr,
		"EMAIL_POLL_INTERVAL":   "100ms",
		"ORDERS_API_URL":        "http://" + ordersAddr,
		"ORDERS_API_TOKEN":      "dev-notifier",
	}, "serve")
	waitReady(t, notifier, "http://"+notifierAddr+"/readyz")

	client := api{base: "http://" + ordersAddr, token: "dev-alice", http: &http.Client{Timeout: 5 * time.Second}}
	status, body, err := client.call("POST", "/orders", "", newOrder("alice@example.com"))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	id := body["id"].(string)
	status, _, err = client.call("POST", "/orders/"+id+"/pay", `"1"`, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	status, _, err = client.call("POST", "/orders/"+id+"/cancel", `"2"`, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)

	rows := outboxRows(t, odb.Pool)
	require.Len(t, rows, 4)
	var emailed []string
	for _, r := range rows {
		if r.eventType != "order.refund_requested" {
			emailed = append(emailed, notify.MessageID(r.eventID))
		}
	}
	require.Eventually(t, func() bool { return len(smtp.Accepted()) >= 3 }, 30*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { return projectionVersion(t, ndb.Pool, id) == 4 }, 30*time.Second, 50*time.Millisecond,
		"order.refund_requested reaches the projection")
	for _, mid := range emailed {
		require.Equal(t, 1, smtp.Count(mid), "one email with Message-ID %s", mid)
	}

	// Re-produce every record of the order exactly as it is on the topic.
	want := map[uuid.UUID]bool{}
	for _, r := range rows {
		want[r.eventID] = true
	}
	records := readTopic(t, broker, want)
	dupsBefore := metricSum(t, "http://"+notifierAddr+"/metrics", "inbox_duplicates_total")
	producer, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.DefaultProduceTopic(topic))
	require.NoError(t, err)
	defer producer.Close()
	for _, rec := range records {
		again := &kgo.Record{Key: rec.raw.Key, Value: rec.raw.Value, Headers: rec.raw.Headers, Partition: rec.raw.Partition}
		require.NoError(t, producer.ProduceSync(context.Background(), again).FirstErr())
	}
	require.Eventually(t, func() bool {
		return metricSum(t, "http://"+notifierAddr+"/metrics", "inbox_duplicates_total") == dupsBefore+float64(len(records))
	}, 30*time.Second, 100*time.Millisecond, "each re-produced record counts as an inbox duplicate")
	var open int
	require.NoError(t, ndb.Pool.QueryRow(context.Background(), "SELECT count(*) FROM email_send WHERE state <> 'sent'").Scan(&open))
	require.Zero(t, open, "no new email intent was written for the duplicates")
	require.Len(t, smtp.Received(), 3, "redelivered events send no email")
}

func projectionVersion(t *testing.T, pool *pgxpool.Pool, orderID string) int64 {
	t.Helper()
	var v int64
	err := pool.QueryRow(context.Background(), "SELECT version FROM order_projection WHERE order_id = $1", orderID).Scan(&v)
	if err != nil {
		return 0
	}
	return v
}

// metricSum adds up every series of a metric family in a Prometheus text
// exposition.
func metricSum(t *testing.T, url, name string) float64 {
	t.Helper()
	res, err := http.Get(url)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		require.NoError(t, err)
		sum += v
	}
	return sum
}

// TestCommitNudgesRelay (R8): with a 10 s poll interval, an order's event
// reaches the broker well before the next poll, because the API nudges the
// relay in its own process right after the commit.
func TestCommitNudgesRelay(t *testing.T) {
	t.Parallel()
	broker := newBroker(t)
	db := ordersDB(t)
	addr := freeAddr(t)
	env := ordersEnv(db, addr, broker)
	env["RELAY_POLL_INTERVAL"] = "10s"
	orders := start(t, "orders", env, "serve")
	waitReady(t, orders, "http://"+addr+"/readyz")
	client := api{base: "http://" + addr, token: "dev-alice", http: &http.Client{Timeout: 5 * time.Second}}

	// The relay also claims once at start-up. Only the second order is
	// measured: by then that first claim has happened, so the next one can
	// only come from a nudge or from the poll 10 s later.
	for i := range 2 {
		status, body, err := client.call("POST", "/orders", "", newOrder("alice@example.com"))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status)
		committed := time.Now()
		var delivered bool
		require.Eventually(t, func() bool {
			require.NoError(t, db.Pool.QueryRow(context.Background(),
				"SELECT state = 'delivered' FROM outbox WHERE aggregate_id = $1", body["id"]).Scan(&delivered))
			return delivered
		}, 5*time.Second, 10*time.Millisecond, "order %d: delivered long before the 10 s poll", i+1)
		t.Logf("order %d delivered %s after the commit", i+1, time.Since(committed))
	}
}
