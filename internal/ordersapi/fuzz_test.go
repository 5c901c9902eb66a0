package ordersapi_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/orders"
	"github.com/outboxref/orders/internal/ordersapi"
	"github.com/outboxref/orders/internal/pgtest"
)

// FuzzCreateOrder feeds arbitrary bodies and Idempotency-Keys to
// POST /orders: decoding and validation must never panic or answer 5xx,
// and every error must be a problem document. Seeds live in
// testdata/fuzz/FuzzCreateOrder; run with go test -fuzz=FuzzCreateOrder.
func FuzzCreateOrder(f *testing.F) {
	f.Add([]byte(`{"email":"a@example.com","currency":"EUR","items":[{"sku":"A","quantity":1,"unit_price_cents":1}]}`), "")
	f.Add([]byte(`{"email":"a@example.com","currency":"EUR","items":[{"sku":"A","quantity":9223372036854775807,"unit_price_cents":9223372036854775807}]}`), "k")
	f.Add([]byte(`{"email":null,"currency":[],"items":{}}`), "")
	f.Add([]byte(`[]`), "")
	f.Add([]byte(`{"items":[null]}`), "key")

	db := pgtest.New(f, schema.Orders()...)
	tokens, err := auth.ParseTokens(devTokens)
	require.NoError(f, err)
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	svc, err := orders.NewService(db.Pool, orders.WithLogger(log))
	require.NoError(f, err)
	h := ordersapi.New(ordersapi.Config{Service: svc, Tokens: tokens, Log: log, Ready: db.Pool.Ping})

	f.Fuzz(func(t *testing.T, body []byte, key string) {
		req := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer dev-alice")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("status %d for body %q: %s", rec.Code, body, rec.Body)
		}
		if rec.Code >= 400 {
			require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
			var p map[string]any
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
			require.EqualValues(t, rec.Code, p["status"])
		} else {
			require.Equal(t, http.StatusCreated, rec.Code)
		}
	})
}
