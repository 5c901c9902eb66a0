package ordersapi_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/ordersapi"
)

// TestViewerRole: a viewer reads the admin API and writes nothing there,
// and the order API refuses it before any handler runs (its subject must
// never read as a customer's).
func TestViewerRole(t *testing.T) {
	t.Parallel()
	tokens, err := auth.ParseTokens("tok-vera=vera:viewer,tok-ops=ops:admin")
	require.NoError(t, err)
	admin := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	// No order service: a refused request never reaches one.
	srv := httptest.NewServer(ordersapi.New(ordersapi.Config{Tokens: tokens, Admin: admin, Log: slog.New(slog.NewJSONHandler(io.Discard, nil))}))
	defer srv.Close()
	call := func(method, path, token string) int {
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, call("GET", "/admin/stats", "tok-vera"))
	require.Equal(t, http.StatusOK, call("POST", "/admin/events/resume", "tok-ops"))
	for _, w := range [][2]string{{"POST", "/admin/events/resume"}, {"POST", "/admin/replays"}, {"PUT", "/admin/publish-modes/x"},
		{"GET", "/orders"}, {"POST", "/orders"}, {"GET", "/orders/0b5e7f3a-6c1d-4e2f-9a8b-7c6d5e4f3a2b"}} {
		require.Equal(t, http.StatusForbidden, call(w[0], w[1], "tok-vera"), "%s %s", w[0], w[1])
	}
}
