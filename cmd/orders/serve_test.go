package main

import (
	"bytes"
	"context"
	"encoding/json"
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
	db := pgtest.New(t, schema.Orders()...)
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

// TestServeBeforeMigrate: started on a database without its tables, serve
// answers /readyz with 503 naming the missing migrations (rather than 200
// while every command fails), then becomes ready once `orders migrate` ran;
// `orders migrate status` lists each line's files.
func TestServeBeforeMigrate(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Scratch(t, "orders_cmd")
	require.NoError(t, migrate.EnsureDatabase(context.Background(), dbURL))
	addr := freeAddr(t)
	env := map[string]string{
		"DATABASE_URL":  dbURL,
		"HTTP_ADDR":     addr,
		"AUTH_TOKENS":   "t=alice:customer",
		"KAFKA_BROKERS": "127.0.0.1:1", // the relay waits for the schema first
	}
	getenv := func(k string) string { return env[k] }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, getenv, io.Discard) }()

	readyz := func() (int, map[string]string) {
		res, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0, nil
		}
		defer res.Body.Close()
		var body map[string]string
		_ = json.NewDecoder(res.Body).Decode(&body)
		return res.StatusCode, body
	}
	var body map[string]string
	require.Eventually(t, func() bool {
		var status int
		status, body = readyz()
		return status == http.StatusServiceUnavailable
	}, 20*time.Second, 50*time.Millisecond)
	require.Regexp(t, "^migration line outbox lacks 00001_outbox.sql, .*; run `orders migrate`$",
		strings.TrimPrefix(body["schema"], migrate.ErrBehind.Error()+": "))

	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"migrate", "status"}, getenv, &out))
	require.Regexp(t, `outbox\s+1\s+00001_outbox.sql\s+pending`, out.String())

	out.Reset()
	require.NoError(t, run(ctx, []string{"migrate"}, getenv, &out))
	require.Contains(t, out.String(), "migrate: applied outbox/00001_outbox.sql")
	require.Eventually(t, func() bool { s, _ := readyz(); return s == http.StatusOK }, 20*time.Second, 50*time.Millisecond)

	out.Reset()
	require.NoError(t, run(ctx, []string{"migrate", "status"}, getenv, &out))
	require.Regexp(t, `outbox\s+1\s+00001_outbox.sql\s+applied`, out.String())
	require.Regexp(t, `orders\s+1\s+00001_orders.sql\s+applied`, out.String())

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop after cancel")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}
