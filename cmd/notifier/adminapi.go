package main

import (
	"log/slog"
	"net/http"

	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/notify"
	"github.com/outboxref/orders/internal/notifyapi"
)

// withAdmin serves the admin API (bearer tokens, admin role: O4, S1) under
// /admin beside the open operational endpoints of ops (/healthz, /readyz,
// /metrics), on the one HTTP_ADDR.
func withAdmin(ops http.Handler, admin *notify.Admin, tokens *auth.Tokens, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	api := notifyapi.New(notifyapi.Config{Admin: admin, Tokens: tokens, Log: log})
	mux.Handle("/admin", api)
	mux.Handle("/admin/", api)
	mux.Handle("/", ops)
	return mux
}
