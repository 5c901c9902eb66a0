package problem_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox/problem"
)

// TestRoundTrip: what Write sends, Read gets back; a body that is not a
// problem document still yields one, from the status.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	problem.Write(rec, problem.Problem{Status: http.StatusBadRequest, Type: "urn:x:validation", Detail: "bad",
		Errors: []problem.FieldError{{Field: "reason", Message: "is required"}}})
	res := rec.Result()
	require.Equal(t, problem.MediaType, res.Header.Get("Content-Type"))
	require.Equal(t, "no-store", res.Header.Get("Cache-Control"))
	p := problem.Read(res)
	require.Equal(t, &problem.Problem{Type: "urn:x:validation", Title: "Bad Request", Status: 400, Detail: "bad",
		Errors: []problem.FieldError{{Field: "reason", Message: "is required"}}}, p)
	var err error = p
	var target *problem.Problem
	require.True(t, errors.As(err, &target))
	require.Equal(t, "400 Bad Request: bad; reason is required", err.Error())

	rec = httptest.NewRecorder()
	http.Error(rec, "upstream down", http.StatusBadGateway)
	p = problem.Read(rec.Result())
	require.Equal(t, 502, p.Status)
	require.Equal(t, problem.TypeBlank, p.Type)
	require.Contains(t, p.Detail, "upstream down")
}

// TestExtensions: extension members are written beside the standard ones
// and read back into Extensions; one that names a standard member cannot
// override it.
func TestExtensions(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	problem.Write(rec, problem.Problem{Status: http.StatusPreconditionFailed, Detail: "stale",
		Extensions: map[string]any{"current_version": 3, "status": 200, "type": "urn:forged"}})
	require.JSONEq(t, `{"type": "about:blank", "title": "Precondition Failed", "status": 412, "detail": "stale", "current_version": 3}`,
		rec.Body.String())
	p := problem.Read(rec.Result())
	require.Equal(t, &problem.Problem{Type: problem.TypeBlank, Title: "Precondition Failed", Status: 412, Detail: "stale",
		Extensions: map[string]any{"current_version": float64(3)}}, p)

	rec = httptest.NewRecorder()
	problem.Write(rec, problem.Problem{Status: http.StatusNotFound})
	require.JSONEq(t, `{"type": "about:blank", "title": "Not Found", "status": 404}`, rec.Body.String())
	require.Nil(t, problem.Read(rec.Result()).Extensions)
}
