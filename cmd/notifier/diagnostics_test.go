package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxref/orders/internal/notify/smtptest"
	"github.com/outboxref/orders/internal/pgtest"
	"github.com/outboxref/orders/internal/testlog"
)

// serveWorld is what `notifier serve` needs around it: a migrated database,
// a Kafka cluster over TCP, an SMTP server and an orders API.
type serveWorld struct {
	dbURL, broker, smtp, ordersAPI string
	mail                           *smtptest.Server
}

func newServeWorld(t *testing.T) serveWorld {
	t.Helper()
	dbURL := pgtest.Scratch(t, "notifier_cmd")
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(6, "orders.events"))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	api := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(api.Close)
	mail := smtptest.Start(t)
	w := serveWorld{dbURL: dbURL, broker: cluster.ListenAddrs()[0], smtp: mail.Addr, ordersAPI: api.URL, mail: mail}
	require.NoError(t, run(context.Background(), []string{"migrate"}, envFrom(map[string]string{"DATABASE_URL": dbURL}), io.Discard))
	return w
}

// env returns the serve environment, with a fresh HTTP_ADDR and a
// consumer group of its own, plus extra.
func (w serveWorld) env(t *testing.T, extra map[string]string) map[string]string {
	t.Helper()
	m := map[string]string{
		"DATABASE_URL":          w.dbURL,
		"KAFKA_BROKERS":         w.broker,
		"KAFKA_GROUP":           "notifier-" + strings.ReplaceAll(t.Name(), "/", "-"),
		"KAFKA_SESSION_TIMEOUT": "6s",
		"SMTP_ADDR":             w.smtp,
		"EMAIL_POLL_INTERVAL":   "50ms",
		"HTTP_ADDR":             freeAddr(t),
		"ORDERS_API_URL":        w.ordersAPI,
		"ORDERS_API_TOKEN":      "svc-secret",
	}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// serving is a `notifier serve` running in the test.
type serving struct {
	base string
	out  *testlog.Buffer
	stop func(t *testing.T)
}

// startServe runs `notifier serve` until the test stops it, and waits for
// /readyz.
func startServe(t *testing.T, env map[string]string) *serving {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &testlog.Buffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, envFrom(env), out) }()
	s := &serving{base: "http://" + env["HTTP_ADDR"], out: out}
	stopped := false
	s.stop = func(t *testing.T) {
		t.Helper()
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("serve did not stop")
		}
	}
	t.Cleanup(func() { s.stop(t) })
	require.Eventually(t, func() bool { return get(s.base+"/readyz") == http.StatusOK }, 20*time.Second, 20*time.Millisecond,
		"serve did not become ready; output:\n%s", out)
	return s
}

// TestServeLogLevel: LOG_LEVEL reaches serve's JSON handler. At debug,
// the gauge refresh (every StatsInterval) writes a debug line; at warn,
// not one info line is written from start to stop.
func TestServeLogLevel(t *testing.T) {
	t.Parallel()
	w := newServeWorld(t)

	t.Run("Debug", func(t *testing.T) {
		t.Parallel()
		s := startServe(t, w.env(t, map[string]string{"LOG_LEVEL": "debug"}))
		require.Eventually(t, func() bool { return strings.Contains(s.out.String(), `"msg":"gauges refreshed"`) }, 20*time.Second, 20*time.Millisecond)
		s.stop(t)
		require.Contains(t, s.out.String(), `"level":"DEBUG"`)
		require.Contains(t, s.out.String(), "config: LOG_LEVEL=debug")
	})
	t.Run("WarnSuppressesInfo", func(t *testing.T) {
		t.Parallel()
		s := startServe(t, w.env(t, map[string]string{"LOG_LEVEL": "warn"}))
		s.stop(t)
		require.NotContains(t, s.out.String(), `"level":"INFO"`, "started, stopped and everything between are info lines")
		require.NotContains(t, s.out.String(), `"level":"DEBUG"`)
	})
}

// TestServeDebugAddr: DEBUG_ADDR serves pprof on a listener of its own,
// which stops with the service; the public port does not serve it.
func TestServeDebugAddr(t *testing.T) {
	t.Parallel()
	w := newServeWorld(t)
	debug := freeAddr(t)
	s := startServe(t, w.env(t, map[string]string{"DEBUG_ADDR": debug}))
	require.Equal(t, http.StatusOK, get("http://"+debug+"/debug/pprof/"))
	require.Equal(t, http.StatusOK, get("http://"+debug+"/debug/pprof/goroutine?debug=1"))
	require.Equal(t, http.StatusNotFound, get(s.base+"/debug/pprof/"))
	require.Equal(t, http.StatusNotFound, get(s.base+"/debug/pprof/goroutine?debug=1"))
	s.stop(t)
	require.Zero(t, get("http://"+debug+"/debug/pprof/"), "the debug listener stops with the service")

	_, err := loadConfig(envFrom(map[string]string{"ORDERS_API_TOKEN": "svc", "HTTP_ADDR": ":8081", "DEBUG_ADDR": "127.0.0.1:8081"}))
	require.ErrorContains(t, err, `DEBUG_ADDR="127.0.0.1:8081" uses the port of the public listener ":8081"`)
	_, err = loadConfig(envFrom(map[string]string{"ORDERS_API_TOKEN": "svc", "LOG_LEVEL": "verbose"}))
	require.ErrorContains(t, err, `LOG_LEVEL="verbose": want debug, info, warn or error`)
}
