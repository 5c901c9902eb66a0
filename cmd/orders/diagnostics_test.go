package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/pgtest"
	"github.com/outboxref/orders/internal/testlog"
)

// TestLogLevel: LOG_LEVEL reaches the JSON handler of `orders relay` (and
// `orders serve`, which builds its logger the same way). At debug the
// relay's topic check says the topic exists, a debug line; at warn not one
// info line is written from start to stop.
func TestLogLevel(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, schema.Orders()...)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(6, "orders.events"))
	require.NoError(t, err)
	t.Cleanup(c.Close)

	run := func(t *testing.T, level string) string {
		addr := freeAddr(t)
		vars := map[string]string{
			"DATABASE_URL":       db.URL,
			"KAFKA_BROKERS":      strings.Join(c.ListenAddrs(), ","),
			"RELAY_METRICS_ADDR": addr,
			"LOG_LEVEL":          level,
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var out testlog.Buffer
		done := make(chan error, 1)
		go func() { done <- runRelayOnly(ctx, func(k string) string { return vars[k] }, &out) }()
		require.Eventually(t, func() bool { return status(t, "http://"+addr+"/readyz") == http.StatusOK }, 20*time.Second, 20*time.Millisecond)
		if level == "debug" {
			require.Eventually(t, func() bool { return strings.Contains(out.String(), `"msg":"kafka topic exists"`) }, 20*time.Second, 20*time.Millisecond)
		}
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("orders relay did not stop")
		}
		return out.String()
	}

	t.Run("Debug", func(t *testing.T) {
		t.Parallel()
		logs := run(t, "debug")
		require.Contains(t, logs, `"level":"DEBUG"`)
		require.Contains(t, logs, "config: LOG_LEVEL=debug")
	})
	t.Run("WarnSuppressesInfo", func(t *testing.T) {
		t.Parallel()
		logs := run(t, "WARN")
		require.NotContains(t, logs, `"level":"INFO"`, "started, stopped and everything between are info lines")
		require.NotContains(t, logs, `"level":"DEBUG"`)
	})
	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		_, err := loadRelayConfig(func(k string) string { return map[string]string{"LOG_LEVEL": "trace"}[k] })
		require.ErrorContains(t, err, `LOG_LEVEL="trace": want debug, info, warn or error`)
	})
}

// TestDebugAddr: DEBUG_ADDR serves pprof on a listener of its own, while
// the public port (the API) does not serve it; without DEBUG_ADDR there is
// no such listener, and DEBUG_ADDR on the public port is refused.
func TestDebugAddr(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, schema.Orders()...)
	public, debug := freeAddr(t), freeAddr(t)
	vars := map[string]string{
		"DATABASE_URL":  db.URL,
		"HTTP_ADDR":     public,
		"DEBUG_ADDR":    debug,
		"AUTH_TOKENS":   "t=alice:customer,o=ops:admin",
		"RELAY_ENABLED": "false",
		"KAFKA_BROKERS": "127.0.0.1:1", // never contacted
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, func(k string) string { return vars[k] }, io.Discard) }()
	require.Eventually(t, func() bool { return status(t, "http://"+public+"/readyz") == http.StatusOK }, 20*time.Second, 20*time.Millisecond)

	require.Equal(t, http.StatusOK, status(t, "http://"+debug+"/debug/pprof/"))
	require.Equal(t, http.StatusOK, status(t, "http://"+debug+"/debug/pprof/heap"))
	for _, token := range []string{"", "t", "o"} {
		require.Equal(t, http.StatusNotFound, statusWith(t, "http://"+public+"/debug/pprof/", token), "public port, token %q", token)
		require.Equal(t, http.StatusNotFound, statusWith(t, "http://"+public+"/debug/pprof/heap", token), "public port, token %q", token)
	}

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop")
	}
	require.Zero(t, status(t, "http://"+debug+"/debug/pprof/"), "the debug listener stops with the service")

	_, err := loadConfig(func(k string) string {
		return map[string]string{"AUTH_TOKENS": "t=a:customer", "HTTP_ADDR": ":8080", "DEBUG_ADDR": "127.0.0.1:8080"}[k]
	})
	require.ErrorContains(t, err, `DEBUG_ADDR="127.0.0.1:8080" uses the port of the public listener ":8080"`)
	c, err := loadConfig(func(k string) string { return map[string]string{"AUTH_TOKENS": "t=a:customer"}[k] })
	require.NoError(t, err)
	require.Empty(t, c.DebugAddr, "off by default")
}

// status returns the status of a GET, or 0 when nothing answers.
func status(t *testing.T, url string) int { return statusWith(t, url, "") }

func statusWith(t *testing.T, url, token string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}
