package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/pgtest"
	"github.com/outboxref/orders/internal/testlog"
)

func TestRelayConfig(t *testing.T) {
	t.Parallel()
	env := func(kv ...string) func(string) string {
		m := map[string]string{"AUTH_TOKENS": "t1=alice:customer"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}

	c, err := loadConfig(env())
	require.NoError(t, err)
	require.Equal(t, 10*time.Second, c.Kafka.ProduceTimeout)
	require.Equal(t, 5*time.Second, c.Relay.DrainTimeout)
	require.Equal(t, "urn:outboxref:orders", c.Relay.Source)

	c, err = loadConfig(env("RELAY_LEASE", "4s"))
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, c.Kafka.ProduceTimeout, "the default follows a short lease (R5a)")
	require.Equal(t, 2*time.Second, c.Relay.DrainTimeout, "a stopping relay waits no longer than a send may take")

	_, err = loadConfig(env("RELAY_LEASE", "10s", "KAFKA_PRODUCE_TIMEOUT", "6s"))
	require.ErrorContains(t, err, "KAFKA_PRODUCE_TIMEOUT")

	var out bytes.Buffer
	c, err = loadConfig(env("KAFKA_SASL_MECHANISM", "scram-sha-512", "KAFKA_SASL_USERNAME", "relay", "KAFKA_SASL_PASSWORD", "s3cret"))
	require.NoError(t, err)
	c.print(&out)
	require.NotContains(t, out.String(), "s3cret", "secrets are printed masked")
	require.Contains(t, out.String(), "KAFKA_SASL_MECHANISM=SCRAM-SHA-512")

	// The connection settings are checked by kafkaconf, as the notifier's are.
	_, err = loadConfig(env("KAFKA_SASL_MECHANISM", "plain", "KAFKA_SASL_USERNAME", "relay"))
	require.ErrorContains(t, err, "SASL mechanism PLAIN needs a username and a password")
	_, err = loadConfig(env("KAFKA_SASL_MECHANISM", "GSSAPI"))
	require.ErrorContains(t, err, `SASL mechanism "GSSAPI"`)
}

// TestStartRelayCreatesTopicInBackground (O3): building the relay does not
// wait for the broker; the topic is created in the background, with the
// configured partitions, once the broker appears after start-up.
func TestStartRelayCreatesTopicInBackground(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	vars := map[string]string{
		"AUTH_TOKENS":             "t1=alice:customer",
		"KAFKA_BROKERS":           net.JoinHostPort("127.0.0.1", port),
		"ORDERS_TOPIC":            "orders.events",
		"ORDERS_TOPIC_PARTITIONS": "6",
	}
	cfg, err := loadConfig(func(k string) string { return vars[k] })
	require.NoError(t, err)
	// The pool is never used here: the relay is built, not run.
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable")
	require.NoError(t, err)
	defer pool.Close()
	var logs testlog.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	began := time.Now()
	relay, err := startRelay(ctx, cfg, pool, slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewRegistry(), orderEventTypes())
	require.NoError(t, err)
	require.NotNil(t, relay)
	require.Less(t, time.Since(began), time.Second, "start-up does not wait for the broker")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "retrying in the background") }, 30*time.Second, 20*time.Millisecond,
		"with no broker, creation fails and is retried without blocking anyone")

	c, err := kfake.NewCluster(kfake.Ports(atoi(t, port)))
	require.NoError(t, err)
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	defer cl.Close()
	require.Eventually(t, func() bool {
		td, err := kadm.NewClient(cl).ListTopics(ctx, "orders.events")
		return err == nil && td.Has("orders.events") && len(td["orders.events"].Partitions) == 6
	}, 45*time.Second, 50*time.Millisecond, "topic created with 6 partitions once the broker is up")
}

// TestRunRelayOnly: `orders relay` starts without blocking on the broker,
// serves its operations endpoints, and stops cleanly on cancel.
func TestRunRelayOnly(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, schema.Orders()...)
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	defer c.Close()
	addr := net.JoinHostPort("127.0.0.1", freePort(t))
	vars := map[string]string{
		"DATABASE_URL":       db.URL,
		"AUTH_TOKENS":        "t1=alice:customer",
		"KAFKA_BROKERS":      strings.Join(c.ListenAddrs(), ","),
		"RELAY_METRICS_ADDR": addr,
		"RELAY_LEASE":        "4s",
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out testlog.Buffer
	done := make(chan error, 1)
	go func() { done <- runRelayOnly(ctx, func(k string) string { return vars[k] }, &out) }()

	var body string
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond)
	require.Contains(t, body, "outbox_oldest_pending_age_seconds")
	require.Contains(t, body, `outbox_stats_up 1`)
	resp, err := http.Get("http://" + addr + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("orders relay did not stop")
	}
	require.Contains(t, out.String(), `"orders relay stopped"`)
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	_, port, err := net.SplitHostPort(l.Addr().String())
	require.NoError(t, err)
	return port
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}
