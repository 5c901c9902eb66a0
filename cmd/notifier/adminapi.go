package main

import (
	"log/slog"
	"net/http"
	"strings"

	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/notify"
	"github.com/outboxref/orders/internal/notifyapi"
)

// withAdmin serves the admin API (bearer tokens, admin role: O4, S1) under
// /admin beside the open operational endpoints of ops (/healthz, /readyz,
// /metrics), on the one HTTP_ADDR.
//
// It splits on the prefix itself rather than with a ServeMux, which would
// answer /admin/../metrics with a redirect to the cleaned /metrics, out of
// the admin API: every path under /admin reaches the API as it came, and
// the API answers 404 for one with "." or ".." segments.
func withAdmin(ops http.Handler, admin *notify.Admin, tokens *auth.Tokens, log *slog.Logger) http.Handler {
	api := notifyapi.New(notifyapi.Config{Admin: admin, Tokens: tokens, Log: log})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/admin" || strings.HasPrefix(r.URL.Path, "/admin/") {
			api.ServeHTTP(w, r)
			return
		}
		ops.ServeHTTP(w, r)
	})
}
