package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/migrate"
	"github.com/outboxref/orders/internal/pgtest"
)

// TestServeWithoutRelay: with RELAY_ENABLED=false the API stays up, and its
// /metrics still reports the outbox backlog from the table (O1), so an
// operator sees the age grow when the separate relays stop. `orders
// healthcheck`, the container's probe, fails before the server listens and
// passes once it is ready.
func TestServeWithoutRelay(t *testing.T) {
	t.Parallel()
	ms, err := migrate.Load(schema.Orders, "orders")
	require.NoError(t, err)
	db := pgtest.New(t, ms)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	env := map[string]string{
		"DATABASE_URL":  db.URL,
		"HTTP_ADDR":     addr,
		"AUTH_TOKENS":   "t=alice:customer",
		"RELAY_ENABLED": "false",
		"KAFKA_BROKERS": "127.0.0.1:1", // never contacted
	}
	getenv := func(k string) string { return env[k] }
	// The container health check runs `orders healthcheck` beside the
	// server: it must fail while nothing serves HTTP_ADDR.
	require.Error(t, run(context.Background(), []string{"healthcheck"}, getenv, io.Discard))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, getenv, io.Discard) }()

	var metrics string
	require.Eventually(t, func() bool {
		res, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		metrics = string(b)
		return res.StatusCode == http.StatusOK
	}, 20*time.Second, 50*time.Millisecond)
	require.Contains(t, metrics, `outbox_oldest_pending_age_seconds{event_type="order.placed"}`)
	require.NoError(t, run(context.Background(), []string{"healthcheck"}, getenv, io.Discard))
	require.True(t, strings.Contains(metrics, "outbox_pending_events"))

	// Still serving a moment later: a disabled relay is not a stopped one.
	select {
	case err := <-done:
		t.Fatalf("serve exited on its own: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop after cancel")
	}
}
