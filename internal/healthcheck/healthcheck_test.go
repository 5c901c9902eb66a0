package healthcheck_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/healthcheck"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for listen, want := range map[string]string{
		":8080":          "http://127.0.0.1:8080/readyz",
		"0.0.0.0:8080":   "http://127.0.0.1:8080/readyz",
		"[::]:8080":      "http://[::1]:8080/readyz",
		"127.0.0.1:8081": "http://127.0.0.1:8081/readyz",
		"orders:8080":    "http://orders:8080/readyz",
	} {
		got, err := healthcheck.URL(listen, "/readyz")
		require.NoError(t, err, listen)
		require.Equal(t, want, got, listen)
	}
	_, err := healthcheck.URL("8080", "/readyz")
	require.Error(t, err, "a port alone is not a listen address")
}

func TestRun(t *testing.T) {
	t.Parallel()
	var status atomic.Int32
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(int(status.Load()))
	}))
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")

	t.Run("Ready", func(t *testing.T) {
		require.NoError(t, healthcheck.Run(context.Background(), addr, "/readyz", io.Discard))
	})
	t.Run("NotReady", func(t *testing.T) {
		status.Store(http.StatusServiceUnavailable)
		t.Cleanup(func() { status.Store(http.StatusOK) })
		err := healthcheck.Run(context.Background(), addr, "/readyz", io.Discard)
		require.ErrorContains(t, err, "503")
	})
	t.Run("NothingListening", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		addr := strings.TrimPrefix(srv.URL, "http://")
		srv.Close()
		require.Error(t, healthcheck.Run(context.Background(), addr, "/readyz", io.Discard))
	})
}
