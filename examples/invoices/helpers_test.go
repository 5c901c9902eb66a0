package invoices_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/examples/invoices"
)

// The tests run against real PostgreSQL and a Kafka wire-protocol broker
// (kfake) reached over TCP. Each test gets a fresh database migrated with
// invoices.Migrate, the way the service migrates its own. Without
// PostgreSQL the test fails with a message saying how to point it at a
// server; it never skips.

// envDatabaseURL names the variable holding the test server's maintenance
// database URL.
const envDatabaseURL = "TEST_DATABASE_URL"

func serverURL() string {
	if u := os.Getenv(envDatabaseURL); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// newDB creates a database, applies the service's migration lines and
// drops the database when the test ends.
func newDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, serverURL())
	require.NoError(t, err, "PostgreSQL is not reachable at %s; start it, or set %s to a server's maintenance database URL",
		serverURL(), envDatabaseURL)
	defer admin.Close(context.WithoutCancel(ctx))

	b := make([]byte, 8)
	_, _ = rand.Read(b)
	name := "invoices_test_" + hex.EncodeToString(b)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err, "create test database")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, serverURL())
		if err != nil {
			t.Errorf("drop %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})

	cfg, err := pgxpool.ParseConfig(serverURL())
	require.NoError(t, err)
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = invoices.Migrate(ctx, pool)
	require.NoError(t, err, "migrate the test database")
	return pool
}

// newBroker starts a one-broker kfake cluster with no topics (the service
// creates its own with EnsureTopic) and returns how clients reach it.
func newBroker(t *testing.T) []kgo.Opt {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}
}

// testLogger discards logs unless INVOICES_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("INVOICES_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// env is one test's service: its database, broker and metrics.
type env struct {
	pool  *pgxpool.Pool
	kafka []kgo.Opt
	reg   *prometheus.Registry
	svc   *invoices.Service
}

// setup builds a service over a fresh database and broker; mod adjusts
// its configuration.
func setup(t *testing.T, mod ...func(*invoices.Config)) *env {
	t.Helper()
	e := &env{pool: newDB(t), kafka: newBroker(t), reg: prometheus.NewRegistry()}
	cfg := invoices.Config{
		Pool:       e.pool,
		Kafka:      e.kafka,
		Registerer: e.reg,
		Logger:     testLogger(),
	}
	for _, m := range mod {
		m(&cfg)
	}
	svc, err := invoices.New(cfg)
	require.NoError(t, err)
	e.svc = svc
	return e
}

// run starts the service's Run in the background and stops it, checking
// that it stopped gracefully, when the test ends.
func (e *env) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err, "Run after a graceful stop")
		case <-time.After(30 * time.Second):
			t.Error("Run did not return within 30s of its context ending")
		}
	})
}

// issue issues an invoice and fails the test if it cannot.
func (e *env) issue(t *testing.T, customer string, totalCents int64) invoices.Invoice {
	t.Helper()
	inv, err := e.svc.Issue(context.Background(), invoices.IssueInvoice{Customer: customer, TotalCents: totalCents})
	require.NoError(t, err)
	return inv
}

// waitTotal waits until the ledger shows want for its customer.
func (e *env) waitTotal(t *testing.T, want invoices.CustomerTotal) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got, err := e.svc.Total(context.Background(), want.Customer)
		require.NoError(c, err)
		require.Equal(c, want, got)
	}, 30*time.Second, 20*time.Millisecond, "ledger of %s", want.Customer)
}

// metric returns the value of the counter or gauge name with the given
// labels, or 0 when the series does not exist.
func (e *env) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := e.reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue series
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// produce writes records to the topic as another producer would: a copy
// of a record already delivered, a forged one, or bytes that are no event.
func (e *env) produce(t *testing.T, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(e.kafka...)
	require.NoError(t, err)
	defer cl.Close()
	for _, r := range recs {
		r.Topic = invoices.DefaultTopic
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
}

// records reads every record of the topic from the start, outside any
// group, until it has n of them.
func (e *env) records(t *testing.T, n int) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(append(slices.Clone(e.kafka),
		kgo.ConsumeTopics(invoices.DefaultTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	require.NoError(t, err)
	defer cl.Close()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "only %d of %d records on %s", len(out), n, invoices.DefaultTopic)
		out = append(out, fs.Records()...)
	}
	return out
}

// lag returns how many records on the topic the ledger's group has not
// committed yet.
func (e *env) lag(t require.TestingT) int64 {
	cl, err := kgo.NewClient(e.kafka...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lags, err := kadm.NewClient(cl).Lag(ctx, invoices.DefaultGroup)
	require.NoError(t, err)
	g := lags[invoices.DefaultGroup]
	require.NoError(t, g.Error())
	require.NotEmpty(t, g.Lag, "the group has no partitions yet")
	return g.Lag.Total()
}

// waitCommitted waits until the ledger's group has committed every record
// on the topic: nothing it processed is left to be redelivered.
func (e *env) waitCommitted(t *testing.T) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.Zero(c, e.lag(c), "records not committed")
	}, 30*time.Second, 50*time.Millisecond)
}

// count runs a count(*) query.
func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), query, args...).Scan(&n), "%s", query)
	return n
}
