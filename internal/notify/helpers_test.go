package notify

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/notify/notifydb"
	"github.com/outboxref/orders/internal/notify/smtptest"
	"github.com/outboxref/orders/internal/pgtest"
)

const testTopic = "orders.events"

// env is one test's world: a fresh notifier database, a Kafka cluster
// reached over TCP, an SMTP server and an orders API.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	dbURL  string
	broker string
	smtp   *smtptest.Server
	orders *fakeOrders
	prod   *kgo.Client
	group  string

	mu         sync.Mutex
	partitions map[string]int32 // record key -> partition it was produced to
}

func newEnv(t *testing.T) *env {
	t.Helper()
	db := pgtest.New(t, schema.Notifier()...)

	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(6, testTopic))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	broker := c.ListenAddrs()[0]

	prod, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.DefaultProduceTopic(testTopic), kgo.RequiredAcks(kgo.AllISRAcks()))
	require.NoError(t, err)
	t.Cleanup(prod.Close)

	return &env{t: t, pool: db.Pool, dbURL: db.URL, broker: broker, smtp: smtptest.Start(t), orders: newFakeOrders(t), prod: prod,
		group: "notifier-" + uuid.NewString()[:8], partitions: map[string]int32{}}
}

// newInbox is an inbox over the env's database that applies events with
// proj, for tests that drive it without a consumer.
func newInbox(t *testing.T, e *env, proj *Projector) *inbox.Inbox {
	t.Helper()
	ib, err := inbox.New(inbox.Config{Pool: e.pool, Apply: proj.Apply, Covered: proj.Covered, Rejected: proj.Rejected,
		GapWindow: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	return ib
}

// service is one running notifier instance.
type service struct {
	*Service
	reg  *prometheus.Registry
	stop context.CancelFunc
	done chan error
}

type svcOpt func(*Config)

func withPolicy(p UnknownPolicy) svcOpt { return func(c *Config) { c.Sender.Policy = p } }
func withBatchMax(n int) svcOpt         { return func(c *Config) { c.Consumer.MaxBatchRecords = n } }
func withLogger(w io.Writer) svcOpt {
	return func(c *Config) { c.Logger = slog.New(slog.NewJSONHandler(w, nil)) }
}
func withGapWindow(d time.Duration) svcOpt {
	return func(c *Config) { c.GapWindow, c.ResyncInterval = d, 50*time.Millisecond }
}

// start runs a notifier instance. Static membership (a fixed instance id)
// makes a restarted instance take its partitions back at once, and the
// short timeouts keep group changes fast.
func (e *env) start(opts ...svcOpt) *service {
	return e.startWith(nil, opts...)
}

func (e *env) startWith(prepare func(*Service), opts ...svcOpt) *service {
	e.t.Helper()
	cfg := Config{
		Consumer: ConsumerConfig{
			Brokers: []string{e.broker}, Topic: testTopic, Group: e.group, InstanceID: e.group + "-1",
			SessionTimeout: 6 * time.Second,
			ExtraOpts:      []kgo.Opt{kgo.FetchMaxWait(100 * time.Millisecond), kgo.HeartbeatInterval(500 * time.Millisecond)},
		},
		Sender: SenderConfig{
			From: "orders@shop.test", Owner: "test", Policy: PolicyHold,
			PollInterval: 50 * time.Millisecond, SendingTimeout: time.Minute, MaxAttempts: 5,
			BackoffBase: 20 * time.Millisecond, BackoffCap: 100 * time.Millisecond,
		},
		Mailer:            &SMTPMailer{Addr: e.smtp.Addr, HeloName: "notifier.test", Timeout: 5 * time.Second},
		Orders:            NewOrdersClient(e.orders.srv.URL, fakeOrdersToken, 2*time.Second),
		GapWindow:         time.Minute,
		ResyncInterval:    50 * time.Millisecond,
		ProcessedEventTTL: 24 * time.Hour,
		CleanupInterval:   time.Hour,
		CleanupBatch:      100,
		StatsInterval:     50 * time.Millisecond,
		Logger:            slog.New(slog.NewJSONHandler(io.Discard, nil)),
	}
	for _, o := range opts {
		o(&cfg)
	}
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	svc, err := NewService(e.pool, cfg)
	require.NoError(e.t, err)
	if prepare != nil {
		prepare(svc)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &service{Service: svc, reg: reg, stop: cancel, done: make(chan error, 1)}
	go func() { s.done <- svc.Run(ctx) }()
	e.t.Cleanup(func() { s.shutdown(e.t) })
	return s
}

// shutdown stops the instance gracefully and waits for it.
func (s *service) shutdown(t *testing.T) error {
	t.Helper()
	s.stop()
	select {
	case err, ok := <-s.done:
		if ok {
			close(s.done)
		}
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("notifier did not stop within 30s")
		return nil
	}
}

// metric sums every series of a counter or gauge, or those whose labels
// match the given name=value pairs.
func (s *service) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// waitMetric waits for a metric to reach want. Metrics are updated right
// after the database work they count, so a test that has just seen the
// database change waits a moment for the metric too.
func waitMetric(t *testing.T, s *service, want float64, name string, labels ...string) {
	t.Helper()
	var got float64
	ok := assertEventually(func() bool {
		got = s.metric(t, name, labels...)
		return got == want
	})
	require.True(t, ok, "metric %s%v: got %v, want %v", name, labels, got, want)
}

// order is a fixture factory for one order's event stream, in the relay's
// record format (R7).
type order struct {
	id      uuid.UUID
	email   string
	version int64
}

func newOrder() *order { return &order{id: uuid.New(), email: "alice@example.com"} }

// ev is one event of an order, ready to produce.
type ev struct {
	id            uuid.UUID
	typ           string
	version       int64
	schemaVersion string
	payload       map[string]any
	time          time.Time // ce_time; now when zero
}

func (o *order) next(typ string, fields map[string]any) ev {
	o.version++
	return o.at(o.version, typ, fields)
}

// at builds the event at an explicit version (for conflicts and gaps).
func (o *order) at(v int64, typ string, fields map[string]any) ev {
	p := map[string]any{"order_id": o.id.String()}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	switch typ {
	case TypePlaced:
		p["customer"], p["email"], p["currency"], p["total_cents"], p["placed_at"] = "alice", o.email, "EUR", 2500, now
		p["items"] = []map[string]any{{"sku": "BOOK-1", "quantity": 2, "unit_price_cents": 1250}}
	case TypePaid:
		p["email"], p["currency"], p["total_cents"], p["paid_at"] = o.email, "EUR", 2500, now
	case TypeCancelled:
		p["email"], p["previous_status"], p["cancelled_at"] = o.email, "paid", now
	case TypeRefundRequested:
		p["currency"], p["amount_cents"], p["requested_at"] = "EUR", 2500, now
	case TypeShipped:
		p["email"], p["shipped_at"] = o.email, now
	}
	for k, v := range fields {
		p[k] = v
	}
	return ev{id: uuid.New(), typ: typ, version: v, schemaVersion: "1", payload: p}
}

func (o *order) record(t testing.TB, e ev) *kgo.Record {
	t.Helper()
	value, err := json.Marshal(e.payload)
	require.NoError(t, err)
	h := func(k, v string) kgo.RecordHeader { return kgo.RecordHeader{Key: k, Value: []byte(v)} }
	return &kgo.Record{
		Key:   []byte(o.id.String()),
		Value: value,
		Headers: []kgo.RecordHeader{
			h("ce_specversion", "1.0"), h("ce_id", e.id.String()), h("ce_type", e.typ),
			h("ce_source", DefaultSource), h("ce_subject", o.id.String()),
			h("ce_time", cmp.Or(e.time, time.Now()).UTC().Format(time.RFC3339Nano)), h("content-type", "application/json"),
			h("ce_aggregatetype", "order"), h("ce_aggregateversion", strconv.FormatInt(e.version, 10)),
			h("ce_schemaversion", e.schemaVersion),
		},
	}
}

// produce writes records to the topic and waits for the broker's ack.
func (e *env) produce(recs ...*kgo.Record) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(e.t, e.prod.ProduceSync(ctx, recs...).FirstErr())
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range recs {
		e.partitions[string(r.Key)] = r.Partition
	}
}

// partitionOf returns the partition the order's records went to.
func partitionOf(t *testing.T, e *env, o *order) int32 {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.partitions[o.id.String()]
	require.True(t, ok, "nothing produced for order %s", o.id)
	return p
}

// produceEvents produces events the orders service wrote (its API then
// lists them, the first at each version).
func (e *env) produceEvents(o *order, evs ...ev) {
	e.t.Helper()
	var recs []*kgo.Record
	for _, x := range evs {
		e.orders.wrote(o.id, x)
		recs = append(recs, o.record(e.t, x))
	}
	e.produce(recs...)
}

// produceForged produces records in the orders service's format that it
// never wrote.
func (e *env) produceForged(o *order, evs ...ev) {
	e.t.Helper()
	var recs []*kgo.Record
	for _, x := range evs {
		recs = append(recs, o.record(e.t, x))
	}
	e.produce(recs...)
}

func (e *env) ledger(orderID uuid.UUID) []notifydb.EmailSend {
	e.t.Helper()
	rows, err := notifydb.New(e.pool).EmailSendListByOrder(context.Background(), orderID)
	require.NoError(e.t, err)
	return rows
}

func (e *env) ledgerStates(orderID uuid.UUID) []string {
	var out []string
	for _, r := range e.ledger(orderID) {
		out = append(out, r.EventType+"="+r.State)
	}
	return out
}

func (e *env) projection(orderID uuid.UUID) notifydb.OrderProjection {
	e.t.Helper()
	p, err := notifydb.New(e.pool).ProjectionGet(context.Background(), orderID)
	require.NoError(e.t, err)
	return p
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// eventually waits for cond, reporting what it last saw on failure.
func (e *env) eventually(cond func() bool, what string) {
	e.t.Helper()
	require.Eventually(e.t, cond, 20*time.Second, 20*time.Millisecond, what)
}

// waitSent waits until the order's ledger shows exactly the given rows.
func (e *env) waitLedger(orderID uuid.UUID, want ...string) {
	e.t.Helper()
	var got []string
	ok := assertEventually(func() bool {
		got = e.ledgerStates(orderID)
		return strings.Join(got, ",") == strings.Join(want, ",")
	})
	require.True(e.t, ok, "ledger of order %s: got %v, want %v", orderID, got, want)
}

func assertEventually(cond func() bool) bool {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cond()
}

// committedOffset reads the group's committed offset of a partition.
func (e *env) committedOffset(partition int32) int64 {
	e.t.Helper()
	adm := kadm.NewClient(e.prod)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	offs, err := adm.FetchOffsets(ctx, e.group)
	require.NoError(e.t, err)
	o, ok := offs.Lookup(testTopic, partition)
	if !ok {
		return -1
	}
	return o.At
}

const fakeOrdersToken = "svc-token"

// fakeOrders is the orders API as far as resync needs it: an order's
// snapshot (set by the test) and which event it wrote at each version
// (every event a test produces with produceEvents, the first at each
// version; produceForged writes records the orders service never wrote).
type fakeOrders struct {
	srv    *httptest.Server
	mu     sync.Mutex
	byID   map[uuid.UUID]OrderSnapshot
	events map[uuid.UUID]map[int64]uuid.UUID
	calls  int
}

func newFakeOrders(t *testing.T) *fakeOrders {
	f := &fakeOrders{byID: map[uuid.UUID]OrderSnapshot{}, events: map[uuid.UUID]map[int64]uuid.UUID{}}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.calls++
		if r.Header.Get("Authorization") != "Bearer "+fakeOrdersToken {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		path, history := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/orders/"), "/events")
		id, err := uuid.Parse(path)
		o, ok := f.byID[id]
		if err != nil || !ok {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"title":"Not Found","status":404}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if history {
			events := []map[string]any{}
			for v, eid := range f.events[id] {
				events = append(events, map[string]any{"version": v, "event_id": eid, "event_type": "order.any"})
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"order_id": id, "version": o.Version, "events": events})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": o.ID, "customer": "alice", "email": o.Email, "currency": o.Currency, "items": []any{},
			"total_cents": o.TotalCents, "status": o.Status, "version": o.Version,
			"created_at": time.Now(), "updated_at": time.Now(),
		})
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// wrote records that the orders service wrote e at its version, unless it
// wrote another event there first.
func (f *fakeOrders) wrote(orderID uuid.UUID, e ev) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.events[orderID] == nil {
		f.events[orderID] = map[int64]uuid.UUID{}
	}
	if _, taken := f.events[orderID][e.version]; !taken {
		f.events[orderID][e.version] = e.id
	}
}

func (f *fakeOrders) set(o OrderSnapshot) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.byID[o.ID] = o
}

func (f *fakeOrders) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}
