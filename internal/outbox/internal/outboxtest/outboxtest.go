// Package outboxtest is what the outbox's tests share: a fresh database
// with the outbox's migrations, a kfake cluster, fixture factories for
// events, readers of the table and the topic, and the plan tests' kit
// (plan.go). The tests of package outbox, relay and operate each use it;
// nothing else does. It imports nothing from the service around the
// outbox (L1).
package outboxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	pgxuuid "github.com/vgarvardt/pgx-google-uuid/v5"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
	"github.com/outboxref/orders/internal/outbox/relay"
)

// The package's tests need nothing from the service around it: each gets a
// fresh database with the outbox's own migrations, applied with goose the
// way a service applies them. PostgreSQL must be running; when it is not,
// the test fails with a message saying how to point it at a server. It
// never skips.

// envDatabaseURL names the variable holding the test server's maintenance
// database URL.
const envDatabaseURL = "TEST_DATABASE_URL"

// DB is one test's database.
type DB struct {
	Pool *pgxpool.Pool
	URL  string
}

// NewDB creates a database, applies the outbox's migration line and
// drops the database when the test ends.
func NewDB(t testing.TB) *DB {
	t.Helper()
	db, drop, err := CreateDB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Error(err)
		}
	})
	return db
}

// CreateDB does NewDB's work for callers without a testing.TB
// (Example functions). drop closes the pool and drops the database.
func CreateDB() (db *DB, drop func() error, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	server := os.Getenv(envDatabaseURL)
	if server == "" {
		server = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		return nil, nil, fmt.Errorf("PostgreSQL is not reachable at %s: %w\nStart it, or set %s to a server's maintenance database URL", server, err, envDatabaseURL)
	}
	defer admin.Close(ctx)

	b := make([]byte, 8)
	_, _ = rand.Read(b)
	name := "outbox_test_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, nil, fmt.Errorf("create test database: %w", err)
	}
	var pool *pgxpool.Pool
	drop = func() error {
		if pool != nil {
			pool.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, server)
		if err != nil {
			return fmt.Errorf("drop %s: %w", name, err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop %s: %w", name, err)
		}
		return nil
	}
	defer func() {
		if err != nil {
			_ = drop() // the error being returned is the one that matters
		}
	}()

	cfg := admin.Config().Copy()
	cfg.Database = name
	sqlDB := stdlib.OpenDB(*cfg)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, outbox.Migrations(),
		goose.WithTableName(outbox.MigrationLine+"_migrations"), goose.WithSlog(slog.New(slog.DiscardHandler)))
	if err != nil {
		return nil, nil, fmt.Errorf("outbox migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return nil, nil, fmt.Errorf("apply outbox migrations: %w", err)
	}

	url := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)
	if cfg.Password != "" {
		url = fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Password, cfg.Host, cfg.Port, name)
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, nil, err
	}
	// The pool a service gives the outbox registers the google/uuid codec,
	// as cmd/orders does (see relay.Config.Pool); the tests and benchmarks
	// run the same way.
	pcfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		pgxuuid.Register(conn.TypeMap())
		return nil
	}
	pool, err = pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", name, err)
	}
	return &DB{Pool: pool, URL: url}, drop, nil
}

const (
	Topic      = "test.events"
	Partitions = 6
	StrictType = "test.strict"
	LooseType  = "test.loose"
)

// Schema is version 1 of both test event types: {"n": <int>, "blob": <string>?}.
var Schema = []byte(`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "required": ["n"],
  "properties": {"n": {"type": "integer"}, "blob": {"type": "string"}},
  "additionalProperties": false
}`)

// Types are one strict and one independent type; the outbox package
// itself knows nothing about any domain.
func Types() []outbox.EventType {
	return []outbox.EventType{
		{Name: StrictType, Ordering: outbox.Strict, Schemas: map[int][]byte{1: Schema}},
		{Name: LooseType, Ordering: outbox.Independent, Schemas: map[int][]byte{1: Schema}},
	}
}

// Env is one test's world: a fresh database and a one-broker kfake cluster
// reached over TCP.
type Env struct {
	DB    *DB
	Kafka *kfake.Cluster
	Addrs []string
	Conn  []kgo.Opt // how clients reach the cluster: seed brokers, SASL
}

// Setup gives a test its Env: a fresh database and a one-broker kfake
// cluster with Topic, both gone when the test ends.
func Setup(t testing.TB, opts ...kfake.Opt) *Env {
	t.Helper()
	db := NewDB(t)
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(Partitions, Topic)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return &Env{DB: db, Kafka: c, Addrs: c.ListenAddrs(), Conn: []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}}
}

// Logger discards, unless OUTBOX_TEST_LOG is set: then it writes debug
// logs to stderr.
func Logger() *slog.Logger {
	if os.Getenv("OUTBOX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Running is a relay started in the background.
type Running struct {
	Relay  *relay.Relay
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Start runs r until the test ends or stop is called.
func Start(t testing.TB, r *relay.Relay) *Running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rr := &Running{Relay: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(rr.done)
		rr.err = r.Run(ctx)
	}()
	t.Cleanup(func() { rr.Stop(t) })
	return rr
}

// Stop cancels the relay and returns Run's error once it returned.
func (rr *Running) Stop(t testing.TB) error {
	t.Helper()
	rr.cancel()
	return rr.Wait(t)
}

// Wait returns Run's error once it returned by itself (a hook stopped it).
func (rr *Running) Wait(t testing.TB) error {
	t.Helper()
	select {
	case <-rr.done:
		return rr.err
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not return within 30s")
		return nil
	}
}

// Recv receives from ch, failing the test after 30s instead of hanging
// until the suite's timeout when a regression never sends.
func Recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out after 30s waiting for %s", what)
		panic("unreachable")
	}
}

// Event is a fixture factory: a valid strict event of aggregate agg at
// version v, adjusted by opts.
func Event(agg string, v int64, opts ...func(*outbox.Event)) outbox.Event {
	e := outbox.Event{
		AggregateType:    "test",
		AggregateID:      agg,
		AggregateVersion: v,
		Type:             StrictType,
		SchemaVersion:    1,
		Payload:          json.RawMessage(fmt.Sprintf(`{"n": %d}`, v)),
	}
	for _, o := range opts {
		o(&e)
	}
	return e
}

// Loose makes an Event of the independent type.
func Loose(e *outbox.Event) { e.Type = LooseType }

// WithPayload sets an Event's payload.
func WithPayload(p string) func(*outbox.Event) {
	return func(e *outbox.Event) { e.Payload = json.RawMessage(p) }
}

// TestWriter writes the test event types, as a service's Writer would.
var TestWriter = func() *outbox.Writer {
	w, err := outbox.NewWriter(Types())
	if err != nil {
		panic(err) // the test schema is a constant
	}
	return w
}()

// Insert commits events through the package's own write path.
func (e *Env) Insert(t testing.TB, events ...outbox.Event) []outbox.Event {
	t.Helper()
	ctx := context.Background()
	tx, err := e.DB.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	require.NoError(t, TestWriter.Insert(ctx, tx, events))
	require.NoError(t, tx.Commit(ctx))
	return events
}

// InsertRaw commits events with a plain INSERT, bypassing the Writer's
// checks, as code older or newer than the relay, or a hand-written
// statement, could. It fills in missing IDs like Insert.
func (e *Env) InsertRaw(t testing.TB, events ...outbox.Event) []outbox.Event {
	t.Helper()
	for i := range events {
		if events[i].ID == uuid.Nil {
			events[i].ID = uuid.New()
		}
		_, err := e.DB.Pool.Exec(context.Background(), `
			INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			events[i].ID, events[i].AggregateType, events[i].AggregateID, events[i].AggregateVersion,
			events[i].Type, events[i].SchemaVersion, events[i].Payload)
		require.NoError(t, err)
	}
	return events
}

// Row is the delivery state of one outbox row.
type Row struct {
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

// Rows returns every outbox row, by event id.
func (e *Env) Rows(t *testing.T) map[uuid.UUID]Row {
	t.Helper()
	rs, err := e.DB.Pool.Query(context.Background(), `
		SELECT event_id, aggregate_id, aggregate_version, state, attempts, lease_owner, lease_token,
		       lease_expires_at, next_attempt_at, last_error_class, last_error, broker_partition, broker_offset
		FROM outbox`)
	require.NoError(t, err)
	defer rs.Close()
	out := map[uuid.UUID]Row{}
	for rs.Next() {
		var r Row
		require.NoError(t, rs.Scan(&r.EventID, &r.AggregateID, &r.Version, &r.State, &r.Attempts, &r.LeaseOwner, &r.LeaseToken,
			&r.LeaseExpiresAt, &r.NextAttemptAt, &r.LastErrorClass, &r.LastError, &r.Partition, &r.Offset))
		out[r.EventID] = r
	}
	require.NoError(t, rs.Err())
	return out
}

// Row returns the outbox row of id, failing the test when there is none.
func (e *Env) Row(t *testing.T, id uuid.UUID) Row {
	t.Helper()
	r, ok := e.Rows(t)[id]
	require.True(t, ok, "no outbox row %s", id)
	return r
}

// Count returns how many outbox rows match a WHERE clause.
func (e *Env) Count(t *testing.T, where string) int {
	t.Helper()
	var n int
	require.NoError(t, e.DB.Pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE "+where).Scan(&n))
	return n
}

// WaitDelivered waits until no row is pending.
func (e *Env) WaitDelivered(t *testing.T, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return e.Count(t, "state = 'pending'") == 0 }, within, 10*time.Millisecond,
		"outbox rows still pending after %s", within)
}

// Record is one record read back from the broker.
type Record struct {
	Key       string
	Value     []byte
	Headers   map[string]string
	Partition int32
	Offset    int64
	EventID   uuid.UUID
	Version   int64
}

// ReadAll reads every record of the Topic, up to the end offsets at the
// time of the call, in partition and offset order.
func (e *Env) ReadAll(t *testing.T) []Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := kgo.NewClient(e.Conn...)
	require.NoError(t, err)
	defer admin.Close()
	ends, err := kadm.NewClient(admin).ListEndOffsets(ctx, Topic)
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
	cl, err := kgo.NewClient(append(slices.Clone(e.Conn),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{Topic: want}))...)
	require.NoError(t, err)
	defer cl.Close()

	byPart := map[int32][]Record{}
	for len(remaining) > 0 {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "reading back the Topic timed out")
		fs.EachError(func(_ string, _ int32, err error) { require.NoError(t, err) })
		fs.EachRecord(func(r *kgo.Record) {
			rec := Record{Key: string(r.Key), Value: r.Value, Headers: map[string]string{}, Partition: r.Partition, Offset: r.Offset}
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
	var out []Record
	for p := int32(0); p < Partitions; p++ {
		out = append(out, byPart[p]...)
	}
	return out
}

// IDs counts the records per event id.
func IDs(recs []Record) map[uuid.UUID]int {
	out := map[uuid.UUID]int{}
	for _, r := range recs {
		out[r.EventID]++
	}
	return out
}

// MetricValue returns the value of one counter or gauge sample in reg.
func MetricValue(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
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

// LogBuffer collects log output written from several goroutines.
type LogBuffer struct {
	mu  sync.Mutex
	buf []byte
}

// Write appends p.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// String returns what was written.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// RelayConfig is a relay's Config for e with test-friendly timings: short
// polls and backoffs, so the tests wait milliseconds rather than seconds.
func (e *Env) RelayConfig() relay.Config {
	return relay.Config{
		Pool:         e.DB.Pool,
		Kafka:        e.Conn,
		Topic:        Topic,
		Source:       "urn:outboxref:test",
		Types:        Types(),
		BatchSize:    50,
		Lease:        10 * time.Second,
		PollInterval: 50 * time.Millisecond,
		BackoffBase:  50 * time.Millisecond,
		BackoffCap:   500 * time.Millisecond,
		Logger:       Logger(),
	}
}
