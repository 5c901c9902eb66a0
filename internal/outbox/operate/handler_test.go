package operate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox/adminguard"
	"github.com/outboxref/orders/internal/outbox/operate"
)

// TestAdminHTTPRefusesHostileInput: every input a hostile run sent to the
// operations API (NUL, bytes that are not UTF-8, control characters in a
// query value, a path id, a reason, a type, a payload; a reason over the
// limit) answers 400 with a problem naming the field, never 500, and
// nothing is stored: the audit, the plans, the publish modes and the
// parked event are as they were. A path with ".." is 404, not a redirect
// out of the prefix. A payload may still hold "\n" in a text field.
func TestAdminHTTPRefusesHostileInput(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	inserted := e.Insert(t, event("agg-1", 1), event("agg-2", 1))
	parked := inserted[0]
	_, err := e.DB.Pool.Exec(ctx, `UPDATE outbox SET state = 'parked', last_error_class = 'unknown_schema_version' WHERE event_id = $1`, parked.ID)
	require.NoError(t, err)
	_, err = e.DB.Pool.Exec(ctx, `UPDATE outbox SET state = 'delivered', delivered_at = now(), broker_partition = 0, broker_offset = 0
		WHERE event_id = $1`, inserted[1].ID)
	require.NoError(t, err)
	admin := e.admin()
	plan, err := admin.PlanReplay(ctx, operate.ReplaySelector{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)},
		operate.ReplayPolicy{}, ops)
	require.NoError(t, err)
	h := admin.Handler(operate.AdminHandlerConfig{Actor: func(*http.Request) string { return "ops2" }, Log: testLogger(),
		Target: func(context.Context) (operate.ReplayTarget, error) {
			return operate.ReplayTarget{}, fmt.Errorf("no replays in this test")
		}})

	stored := func() string {
		var s string
		require.NoError(t, e.DB.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_audit)::text || '/' ||
			(SELECT count(*) FROM outbox_replay_plan)::text || '/' || (SELECT count(*) FROM outbox_publish_mode)::text || '/' ||
			(SELECT payload::text || schema_version::text || state FROM outbox WHERE event_id = $1)`, parked.ID).Scan(&s))
		return s
	}
	before := stored()
	id, delivered, planID := parked.ID.String(), inserted[1].ID.String(), plan.ID.String()
	long := strings.Repeat("a", adminguard.MaxReasonChars+1)

	for name, tc := range map[string]struct{ method, target, body, field, detail string }{
		"ParkedTypeNUL":         {"GET", "/events/parked?type=%00", "", "type", "U+0000"},
		"ParkedAggregateNUL":    {"GET", "/events/parked?aggregate=%00", "", "aggregate", "U+0000"},
		"ParkedTypeBadUTF8":     {"GET", "/events/parked?type=%ff%fe", "", "type", "valid UTF-8"},
		"ShadowReportTypeNUL":   {"GET", "/shadow-report?type=%00", "", "type", "U+0000"},
		"EventIDNUL":            {"GET", "/events/%00", "", "id", "U+0000"},
		"PublishModeReasonNUL":  {"PUT", "/publish-modes/" + strictType, `{"mode":"shadow","reason":"a\u0000b"}`, "reason", "U+0000"},
		"PublishModeTypeNUL":    {"PUT", "/publish-modes/%00", `{"mode":"shadow","reason":"x"}`, "type", "U+0000"},
		"PublishModeReasonLong": {"PUT", "/publish-modes/" + strictType, `{"mode":"shadow","reason":"` + long + `"}`, "reason", "at most 1024 characters (it has 1025)"},
		"PlanReasonNUL":         {"POST", "/replays", `{"ids":["` + delivered + `"],"reason":"\u0000"}`, "reason", "U+0000"},
		"PlanForgedApproval":    {"POST", "/replays", `{"ids":["` + delivered + `"],"reason":"x\napproved by ops2"}`, "reason", "U+000A"},
		"PlanTypeNUL":           {"POST", "/replays", `{"from":"2020-01-01T00:00:00Z","to":"2030-01-01T00:00:00Z","type":"\u0000","reason":"x"}`, "type", "U+0000"},
		"PlanReasonBadUTF8":     {"POST", "/replays", "{\"ids\":[\"" + delivered + "\"],\"reason\":\"\xff\xfe\"}", "reason", "valid UTF-8"},
		"ApproveReasonCR":       {"POST", "/replays/" + planID + "/approve", `{"reason":"ok\rrewritten"}`, "reason", "U+000D"},
		"ApproveReasonLong":     {"POST", "/replays/" + planID + "/approve", `{"reason":"` + long + `"}`, "reason", "at most 1024 characters"},
		"RunReasonESC":          {"POST", "/replays/" + planID + "/run", `{"reason":"\u001b[2Kgo"}`, "reason", "U+001B"},
		"RepairReasonNUL":       {"POST", "/events/" + id + "/repair", `{"schema_version":1,"reason":"\u0000"}`, "reason", "U+0000"},
		"RepairReasonLong":      {"POST", "/events/" + id + "/repair", `{"schema_version":1,"reason":"` + long + `"}`, "reason", "at most 1024 characters"},
		"RepairPayloadNUL":      {"POST", "/events/" + id + "/repair", `{"payload":{"n":1,"blob":"\u0000"},"reason":"x"}`, "payload.blob", "NUL"},
		"RepairPayloadBadUTF8":  {"POST", "/events/" + id + "/repair", "{\"payload\":{\"n\":1,\"blob\":\"\xc3\"},\"reason\":\"x\"}", "payload.blob", "valid UTF-8"},
		"ResumeReasonNUL":       {"POST", "/events/resume", `{"ids":["` + id + `"],"reason":"\u0000"}`, "reason", "U+0000"},
		"ResumeTypeNUL":         {"POST", "/events/resume", `{"type":"\u0000","reason":"x"}`, "type", "U+0000"},
	} {
		t.Run(name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body)))
			require.Equal(t, http.StatusBadRequest, rec.Code, rec.Body.String())
			require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
			var p struct {
				Type, Detail, Field string
				Status              int
			}
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
			require.Equal(t, adminguard.TypeValidation, p.Type)
			require.Equal(t, tc.field, p.Field)
			require.Contains(t, p.Detail, tc.field+" ")
			require.Contains(t, p.Detail, tc.detail)
		})
	}
	require.Equal(t, before, stored(), "nothing was stored")

	for _, target := range []string{"/events/../stats", "/events/%2e%2e/stats", "/events//parked", ""} {
		req := httptest.NewRequest("GET", "/stats", nil)
		req.URL.Path = target
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, http.StatusNotFound, rec.Code, target)
		require.Empty(t, rec.Header().Get("Location"), "%q is not redirected out of the prefix", target)
	}

	// A payload's text may hold a newline: it is a JSON escape, stored in
	// jsonb as such.
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/events/"+id+"/repair",
		strings.NewReader(`{"payload":{"n":1,"blob":"line 1\nline 2"},"schema_version":1,"reason":"multi-line note"}`)))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var blob string
	require.NoError(t, e.DB.Pool.QueryRow(ctx, `SELECT payload->>'blob' FROM outbox WHERE event_id = $1`, parked.ID).Scan(&blob))
	require.Equal(t, "line 1\nline 2", blob)
}
