package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

const (
	topic      = "test.events"
	partitions = 6
	strictType = "test.strict"
	looseType  = "test.loose"
)

// testSchema is version 1 of both test event types: {"n": <int>, "blob": <string>?}.
var testSchema = []byte(`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "required": ["n"],
  "properties": {"n": {"type": "integer"}, "blob": {"type": "string"}},
  "additionalProperties": false
}`)

// testTypes are one strict and one independent type; the outbox package
// itself knows nothing about any domain.
func testTypes() []outbox.EventType {
	return []outbox.EventType{
		{Name: strictType, Ordering: outbox.Strict, Schemas: map[int][]byte{1: testSchema}},
		{Name: looseType, Ordering: outbox.Independent, Schemas: map[int][]byte{1: testSchema}},
	}
}

// env is one test's world: a fresh database and a one-broker kfake cluster
// reached over TCP.
type env struct {
	db    *testDB
	kafka *kfake.Cluster
	addrs []string
	conn  []kgo.Opt // how clients reach the cluster: seed brokers, SASL
}

func setup(t testing.TB, opts ...kfake.Opt) *env {
	t.Helper()
	db := newTestDB(t)
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return &env{db: db, kafka: c, addrs: c.ListenAddrs(), conn: []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}}
}

func testLogger() *slog.Logger {
	if os.Getenv("OUTBOX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// relayConfig is a relay's Config plus the crash-point hooks that only
// tests can set (export_test.go).
type relayConfig struct {
	outbox.Config
	Hooks outbox.Hooks
}

// relay builds a relay with test-friendly timings; mod adjusts the config.
func (e *env) relay(t testing.TB, mod func(*relayConfig)) *outbox.Relay {
	t.Helper()
	cfg := relayConfig{Config: outbox.Config{
		Pool:         e.db.Pool,
		Kafka:        e.conn,
		Topic:        topic,
		Source:       "urn:outboxref:test",
		Types:        testTypes(),
		BatchSize:    50,
		Lease:        10 * time.Second,
		PollInterval: 50 * time.Millisecond,
		BackoffBase:  50 * time.Millisecond,
		BackoffCap:   500 * time.Millisecond,
		Logger:       testLogger(),
	}}
	if mod != nil {
		mod(&cfg)
	}
	r, err := outbox.NewRelayWithHooks(cfg.Config, cfg.Hooks)
	require.NoError(t, err)
	return r
}

// running is a relay started in the background.
type running struct {
	relay  *outbox.Relay
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// start runs r until the test ends or stop is called.
func start(t testing.TB, r *outbox.Relay) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rr := &running{relay: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(rr.done)
		rr.err = r.Run(ctx)
	}()
	t.Cleanup(func() { rr.stop(t) })
	return rr
}

// stop cancels the relay and returns Run's error once it returned.
func (rr *running) stop(t testing.TB) error {
	t.Helper()
	rr.cancel()
	return rr.wait(t)
}

// wait returns Run's error once it returned by itself (a hook stopped it).
func (rr *running) wait(t testing.TB) error {
	t.Helper()
	select {
	case <-rr.done:
		return rr.err
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not return within 30s")
		return nil
	}
}

// recv receives from ch, failing the test after 30s instead of hanging
// until the suite's timeout when a regression never sends.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out after 30s waiting for %s", what)
		panic("unreachable")
	}
}

// event is a fixture factory: a valid strict event of aggregate agg at
// version v, adjusted by opts.
func event(agg string, v int64, opts ...func(*outbox.Event)) outbox.Event {
	e := outbox.Event{
		AggregateType:    "test",
		AggregateID:      agg,
		AggregateVersion: v,
		Type:             strictType,
		SchemaVersion:    1,
		Payload:          json.RawMessage(fmt.Sprintf(`{"n": %d}`, v)),
	}
	for _, o := range opts {
		o(&e)
	}
	return e
}

func loose(e *outbox.Event) { e.Type = looseType }

func withPayload(p string) func(*outbox.Event) {
	return func(e *outbox.Event) { e.Payload = json.RawMessage(p) }
}

// testWriter writes the test event types, as a service's Writer would.
var testWriter = func() *outbox.Writer {
	w, err := outbox.NewWriter(testTypes())
	if err != nil {
		panic(err) // the test schema is a constant
	}
	return w
}()

// insert commits events through the package's own write path.
func (e *env) insert(t testing.TB, events ...outbox.Event) []outbox.Event {
	t.Helper()
	ctx := context.Background()
	tx, err := e.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	require.NoError(t, testWriter.Insert(ctx, tx, events))
	require.NoError(t, tx.Commit(ctx))
	return events
}

// insertRaw commits events with a plain INSERT, bypassing the Writer's
// checks, as code older or newer than the relay, or a hand-written
// statement, could. It fills in missing IDs like Insert.
func (e *env) insertRaw(t testing.TB, events ...outbox.Event) []outbox.Event {
	t.Helper()
	for i := range events {
		if events[i].ID == uuid.Nil {
			events[i].ID = uuid.New()
		}
		_, err := e.db.Pool.Exec(context.Background(), `
			INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			events[i].ID, events[i].AggregateType, events[i].AggregateID, events[i].AggregateVersion,
			events[i].Type, events[i].SchemaVersion, events[i].Payload)
		require.NoError(t, err)
	}
	return events
}

// row is the delivery state of one outbox row.
type row struct {
	EventID        uuid.UUID
	AggregateID    string
	Version        int64
	State          string
	Attempts       int
	LeaseOwner     *string
	LeaseToken     *uuid.UUID
	LeaseExpiresAt *time.Time
	NextAttemptAt  time.Time
	LastErrorClass *string
	LastError      *string
	Partition      *int32
	Offset         *int64
}

func (e *env) rows(t *testing.T) map[uuid.UUID]row {
	t.Helper()
	rs, err := e.db.Pool.Query(context.Background(), `
		SELECT event_id, aggregate_id, aggregate_version, state, attempts, lease_owner, lease_token,
		       lease_expires_at, next_attempt_at, last_error_class, last_error, broker_partition, broker_offset
		FROM outbox`)
	require.NoError(t, err)
	defer rs.Close()
	out := map[uuid.UUID]row{}
	for rs.Next() {
		var r row
		require.NoError(t, rs.Scan(&r.EventID, &r.AggregateID, &r.Version, &r.State, &r.Attempts, &r.LeaseOwner, &r.LeaseToken,
			&r.LeaseExpiresAt, &r.NextAttemptAt, &r.LastErrorClass, &r.LastError, &r.Partition, &r.Offset))
		out[r.EventID] = r
	}
	require.NoError(t, rs.Err())
	return out
}

func (e *env) row(t *testing.T, id uuid.UUID) row {
	t.Helper()
	r, ok := e.rows(t)[id]
	require.True(t, ok, "no outbox row %s", id)
	return r
}

// count returns how many outbox rows match a WHERE clause.
func (e *env) count(t *testing.T, where string) int {
	t.Helper()
	var n int
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE "+where).Scan(&n))
	return n
}

// waitDelivered waits until no row is pending.
func (e *env) waitDelivered(t *testing.T, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return e.count(t, "state = 'pending'") == 0 }, within, 10*time.Millisecond,
		"outbox rows still pending after %s", within)
}

// record is one record read back from the broker.
type record struct {
	Key       string
	Value     []byte
	Headers   map[string]string
	Partition int32
	Offset    int64
	EventID   uuid.UUID
	Version   int64
}

// readAll reads every record of the topic, up to the end offsets at the
// time of the call, in partition and offset order.
func (e *env) readAll(t *testing.T) []record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := kgo.NewClient(e.conn...)
	require.NoError(t, err)
	defer admin.Close()
	ends, err := kadm.NewClient(admin).ListEndOffsets(ctx, topic)
	require.NoError(t, err)
	want := map[int32]kgo.Offset{}
	remaining := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		require.NoError(t, o.Err)
		if o.Offset > 0 {
			want[o.Partition] = kgo.NewOffset().AtStart()
			remaining[o.Partition] = o.Offset
		}
	})
	if len(want) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(append(slices.Clone(e.conn),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: want}))...)
	require.NoError(t, err)
	defer cl.Close()

	byPart := map[int32][]record{}
	for len(remaining) > 0 {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "reading back the topic timed out")
		fs.EachError(func(_ string, _ int32, err error) { require.NoError(t, err) })
		fs.EachRecord(func(r *kgo.Record) {
			rec := record{Key: string(r.Key), Value: r.Value, Headers: map[string]string{}, Partition: r.Partition, Offset: r.Offset}
			for _, h := range r.Headers {
				_, dup := rec.Headers[h.Key]
				require.False(t, dup, "header %s twice", h.Key)
				rec.Headers[h.Key] = string(h.Value)
			}
			rec.EventID, _ = uuid.Parse(rec.Headers[cloudevents.HeaderID])
			fmt.Sscan(rec.Headers[cloudevents.HeaderAggregateVersion], &rec.Version) //nolint:errcheck // checked by the tests that care
			byPart[r.Partition] = append(byPart[r.Partition], rec)
			if end, ok := remaining[r.Partition]; ok && r.Offset+1 >= end {
				delete(remaining, r.Partition)
			}
		})
	}
	var out []record
	for p := int32(0); p < partitions; p++ {
		out = append(out, byPart[p]...)
	}
	return out
}

// ids counts the records per event id.
func ids(recs []record) map[uuid.UUID]int {
	out := map[uuid.UUID]int{}
	for _, r := range recs {
		out[r.EventID]++
	}
	return out
}

// metricValue returns the value of one counter or gauge sample in reg.
func metricValue(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				if !hasLabel(m, k, v) {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k && l.GetValue() == v {
			return true
		}
	}
	return false
}

// claimLog records the claims relays make, from their hooks.
type claimLog struct {
	mu     sync.Mutex
	claims []claimSeen
}

type claimSeen struct {
	at    time.Time
	owner string
	outbox.Claim
}

func (l *claimLog) hook(owner string) func(context.Context, []outbox.Claim) error {
	return func(_ context.Context, cs []outbox.Claim) error {
		now := time.Now()
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, c := range cs {
			l.claims = append(l.claims, claimSeen{at: now, owner: owner, Claim: c})
		}
		return nil
	}
}

func (l *claimLog) all() []claimSeen {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]claimSeen(nil), l.claims...)
}

// logBuffer collects log output written from several goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
