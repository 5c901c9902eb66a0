package ordersapi

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/orders"
	"github.com/outboxref/orders/internal/outbox/problem"
)

// TestFailEventTooLarge (W6): a command whose event would exceed the
// outbox's limit is the request's fault, answered 413 with its own problem
// type, not a 500. No order input the API accepts is large enough to reach
// it today, hence a unit test of the mapping.
func TestFailEventTooLarge(t *testing.T) {
	t.Parallel()
	a := &api{Config{Log: slog.New(slog.DiscardHandler)}}
	rec := httptest.NewRecorder()
	a.fail(rec, httptest.NewRequest(http.MethodPost, "/orders", nil), fmt.Errorf("record place events: %w", orders.ErrEventTooLarge))
	require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
	var p problem.Problem
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
	require.Equal(t, typeTooLarge, p.Type)
	require.Equal(t, "Event too large", p.Title)
}

// TestFailUnavailable: a failure before commit is a 503 with Retry-After
// and its own problem type, distinct from the commit-unknown 500.
func TestFailUnavailable(t *testing.T) {
	t.Parallel()
	a := &api{Config{Log: slog.New(slog.DiscardHandler)}}
	rec := httptest.NewRecorder()
	a.fail(rec, httptest.NewRequest(http.MethodPost, "/orders", nil), fmt.Errorf("place: %w", orders.ErrUnavailable))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, "1", rec.Header().Get("Retry-After"))
	var p problem.Problem
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
	require.Equal(t, typeUnavailable, p.Type)

	rec = httptest.NewRecorder()
	a.fail(rec, httptest.NewRequest(http.MethodPost, "/orders", nil), fmt.Errorf("place: %w", orders.ErrCommitUnknown))
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.Empty(t, rec.Header().Get("Retry-After"))
}
