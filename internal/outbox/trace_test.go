package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/internal/outboxtest"
)

// testTraceparent is a valid W3C traceparent, sampled.
const testTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// spanContext returns a remote span context, as an HTTP server finds in its
// caller's headers, with the given tracestate ("" for none).
func spanContext(t *testing.T, traceID, spanID, tracestate string) trace.SpanContext {
	t.Helper()
	tid, err := trace.TraceIDFromHex(traceID)
	require.NoError(t, err)
	sid, err := trace.SpanIDFromHex(spanID)
	require.NoError(t, err)
	ts, err := trace.ParseTraceState(tracestate)
	require.NoError(t, err)
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true,
	})
}

// insertIn commits events through the Writer, in ctx.
func (e *env) insertIn(t *testing.T, ctx context.Context, events ...outbox.Event) []outbox.Event {
	t.Helper()
	tx, err := e.DB.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	require.NoError(t, testWriter.Insert(ctx, tx, events))
	require.NoError(t, tx.Commit(ctx))
	return events
}

// storedTrace reads the trace context stored with a row; "" for NULL.
func (e *env) storedTrace(t *testing.T, ev outbox.Event) (traceparent, tracestate string) {
	t.Helper()
	var tp, ts *string
	require.NoError(t, e.DB.Pool.QueryRow(t.Context(), "SELECT traceparent, tracestate FROM outbox WHERE event_id = $1", ev.ID).Scan(&tp, &ts))
	if tp != nil {
		traceparent = *tp
	}
	if ts != nil {
		tracestate = *ts
	}
	return traceparent, tracestate
}

// TestWriterStoresTraceContext (L4): an event without a trace context gets
// the span context of Insert's ctx, in place and in its row, tracestate
// included; an event that names its own keeps it whole; a tracestate the
// record header could not carry is dropped, not the event.
func TestWriterStoresTraceContext(t *testing.T) {
	t.Parallel()
	e := &env{&outboxtest.Env{DB: newTestDB(t)}}
	sc := spanContext(t, "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "vendor=1,other=x")
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), sc)
	const own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"

	evs := e.insertIn(t, ctx,
		event("traced", 1),
		event("traced", 2, func(ev *outbox.Event) { ev.Traceparent = own }),
	)
	require.Equal(t, testTraceparent, evs[0].Traceparent, "filled in place from ctx")
	require.Equal(t, "vendor=1,other=x", evs[0].Tracestate)
	tp, ts := e.storedTrace(t, evs[0])
	require.Equal(t, testTraceparent, tp)
	require.Equal(t, "vendor=1,other=x", ts)
	tp, ts = e.storedTrace(t, evs[1])
	require.Equal(t, own, tp, "a trace context given by the caller wins")
	require.Empty(t, ts, "and is not mixed with ctx's tracestate")

	long := strings.Join([]string{"a=" + strings.Repeat("x", 200), "b=" + strings.Repeat("y", 200), "c=" + strings.Repeat("z", 200)}, ",")
	ctx = trace.ContextWithRemoteSpanContext(context.Background(), spanContext(t, "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", long))
	ev := e.insertIn(t, ctx, event("long-state", 1))[0]
	tp, ts = e.storedTrace(t, ev)
	require.Equal(t, testTraceparent, tp)
	require.Empty(t, ts, "a tracestate over the header bound is dropped")

	ev = e.insertIn(t, context.Background(), event("untraced", 1))[0]
	tp, ts = e.storedTrace(t, ev)
	require.Empty(t, tp, "no span in ctx, no trace context")
	require.Empty(t, ts)
}
