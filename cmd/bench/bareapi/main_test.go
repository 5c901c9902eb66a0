package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/pgtest"
)

// The reference must do the create's real work, or the api scenario
// compares the service with something that writes less: the order, its
// line and a pending order.placed row whose payload names the order, all
// committed, and nothing for a request it refuses.
func TestCreateWritesTheOrderItsLineAndItsEvent(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t, schema.Orders()...)
	pool, err := openPool(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	srv := httptest.NewServer(newHandler(pool, "secret"))
	t.Cleanup(srv.Close)

	post := func(token, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := srv.Client().Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { res.Body.Close() })
		return res
	}
	const body = `{"email":"bench@example.com","currency":"EUR","items":[{"sku":"BOOK-1","quantity":2,"unit_price_cents":1250}]}`
	require.Equal(t, http.StatusUnauthorized, post("wrong", body).StatusCode)
	require.Equal(t, http.StatusBadRequest, post("secret", `{"email":`).StatusCode)
	for name, bad := range map[string]string{
		"no items":           `{"email":"a@example.com","currency":"EUR","items":[]}`,
		"NUL in the email":   `{"email":"a\u0000@example.com","currency":"EUR","items":[{"sku":"B","quantity":1,"unit_price_cents":1}]}`,
		"control character":  `{"email":"a@example.com","currency":"EUR","items":[{"sku":"B\u0007","quantity":1,"unit_price_cents":1}]}`,
		"a total past int64": `{"email":"a@example.com","currency":"EUR","items":[{"sku":"B","quantity":9223372036854775807,"unit_price_cents":9223372036854775807}]}`,
	} {
		require.Equal(t, http.StatusUnprocessableEntity, post("secret", bad).StatusCode, name)
	}
	require.Equal(t, http.StatusBadRequest, post("secret", `{"email":"`+strings.Repeat("a", 70<<10)+`"}`).StatusCode, "a body past 64 KiB")
	require.Equal(t, http.StatusBadRequest, post("secret", "{\"email\":\"a\xff@example.com\",\"currency\":\"EUR\",\"items\":[{\"sku\":\"B\",\"quantity\":1,\"unit_price_cents\":1}]}").StatusCode, "invalid UTF-8")

	res := post("secret", body)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	var o order
	require.NoError(t, json.NewDecoder(res.Body).Decode(&o))
	require.Equal(t, uuid.Version(7), o.ID.Version())
	require.EqualValues(t, 2500, o.TotalCents)

	var orders, lines int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM order_lines WHERE order_id = $1)`, o.ID).Scan(&orders, &lines))
	require.Equal(t, 1, orders)
	require.Equal(t, 1, lines)
	var eventID uuid.UUID
	var state, aggregate string
	var payload placed
	require.NoError(t, pool.QueryRow(ctx, `SELECT event_id, state, aggregate_id, payload FROM outbox`).Scan(&eventID, &state, &aggregate, &payload))
	require.Equal(t, uuid.Version(7), eventID.Version())
	require.Equal(t, "pending", state)
	require.Equal(t, o.ID.String(), aggregate)
	require.Equal(t, o.ID, payload.OrderID)
	require.EqualValues(t, 2500, payload.TotalCents)
}
