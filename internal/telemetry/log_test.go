package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/orders/internal/telemetry"
)

// remoteSpan returns ctx holding a fixed span context.
func remoteSpan(t *testing.T) (context.Context, trace.SpanContext) {
	t.Helper()
	tid, err := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	require.NoError(t, err)
	sid, err := trace.SpanIDFromHex("00f067aa0ba902b7")
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	return trace.ContextWithSpanContext(context.Background(), sc), sc
}

// lines decodes JSON log lines.
func lines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		out = append(out, m)
	}
	return out
}

// TestLogHandlerAddsTraceIDs (L4, O2): a line logged with a context that
// holds a span carries its trace_id and span_id; a line without one, or
// logged without a context, carries neither. Attributes and groups of the
// wrapped handler, and its level, still apply.
func TestLogHandlerAddsTraceIDs(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
	ctx, sc := remoteSpan(t)

	log.InfoContext(ctx, "in a span", "event_id", "e1")
	log.With("component", "relay").ErrorContext(ctx, "with attrs")
	log.WithGroup("g").InfoContext(ctx, "in a group", "k", "v")
	log.InfoContext(context.Background(), "no span")
	log.Info("no context")
	log.DebugContext(ctx, "below the level")

	got := lines(t, &buf)
	require.Len(t, got, 5, "the wrapped handler's level still filters")
	for _, i := range []int{0, 1} {
		require.Equal(t, sc.TraceID().String(), got[i]["trace_id"], got[i]["msg"])
		require.Equal(t, sc.SpanID().String(), got[i]["span_id"], got[i]["msg"])
	}
	require.Equal(t, "e1", got[0]["event_id"])
	require.Equal(t, "relay", got[1]["component"])
	require.Equal(t, map[string]any{"k": "v", "trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()}, got[2]["g"],
		"under WithGroup the ids land in the group, as documented")
	for _, i := range []int{3, 4} {
		require.NotContains(t, got[i], "trace_id", got[i]["msg"])
		require.NotContains(t, got[i], "span_id", got[i]["msg"])
	}
}

// TestLogHandlerLeavesRecordAlone: the handler adds its attributes to a
// copy that shares nothing with the record it was given, so the caller (or
// a handler fanning the record out) can still add to the record. When two
// copies of a record both append to shared storage, slog notices and adds
// a "!BUG" attribute.
func TestLogHandlerLeavesRecordAlone(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	h := telemetry.LogHandler(slog.NewJSONHandler(&buf, nil))
	ctx, _ := remoteSpan(t)
	r := slog.NewRecord(testTime, slog.LevelInfo, "shared", 0)
	// Past the record's five inline attributes, into storage with room to
	// spare that a plain copy of the record would share.
	for i := range 10 {
		r.AddAttrs(slog.Int("a", i))
	}
	require.NoError(t, h.Handle(ctx, r))
	r.AddAttrs(slog.String("after", "handle"))
	var keys []string
	r.Attrs(func(a slog.Attr) bool { keys = append(keys, a.Key); return true })
	require.NotContains(t, keys, "!BUG")
	require.Len(t, keys, 11)
	require.Contains(t, buf.String(), `"trace_id"`)
}
