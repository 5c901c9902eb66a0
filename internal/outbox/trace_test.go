package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/orders/internal/outbox"
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
	tx, err := e.db.Pool.Begin(ctx)
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
	require.NoError(t, e.db.Pool.QueryRow(t.Context(), "SELECT traceparent, tracestate FROM outbox WHERE event_id = $1", ev.ID).Scan(&tp, &ts))
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
	e := &env{db: newTestDB(t)}
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

// TestProduceSpanContinuesStoredTrace (L4): the relay sends a row in a
// produce span whose parent is the context stored with the row (same trace
// id, however long the row waited), linked to the relay's batch span; the
// record carries the produce span's context, tracestate included, for the
// consumer to continue. A row stored without a context gets a trace of its
// own.
func TestProduceSpanContinuesStoredTrace(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	stored := spanContext(t, "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "vendor=1")
	traced := e.insertIn(t, trace.ContextWithRemoteSpanContext(context.Background(), stored), event("traced", 1))[0]
	untraced := e.insertIn(t, context.Background(), event("untraced", 1))[0]
	start(t, e.relay(t, func(c *relayConfig) { c.TracerProvider = tp }))
	e.waitDelivered(t, 10*time.Second)
	records := map[string]record{}
	for _, r := range e.readAll(t) {
		records[r.Key] = r
	}

	var batches []sdktrace.ReadOnlySpan
	produce := map[string]sdktrace.ReadOnlySpan{}
	require.Eventually(t, func() bool {
		batches, produce = nil, map[string]sdktrace.ReadOnlySpan{}
		for _, s := range rec.Ended() {
			switch {
			case s.Name() == "outbox relay batch":
				batches = append(batches, s)
			case s.SpanKind() == trace.SpanKindProducer:
				for _, a := range s.Attributes() {
					if a.Key == "messaging.kafka.message.key" {
						produce[a.Value.AsString()] = s
					}
				}
			}
		}
		return len(produce) == 2 && len(batches) > 0
	}, 10*time.Second, 10*time.Millisecond, "the batch span ends after the produce spans, once the batch is settled")

	isBatch := func(sc trace.SpanContext) bool {
		for _, b := range batches {
			if b.SpanContext().Equal(sc) {
				return true
			}
		}
		return false
	}
	p := produce["traced"]
	require.Equal(t, "send "+topic, p.Name())
	require.Equal(t, stored.TraceID(), p.SpanContext().TraceID(), "one trace id from the writer on")
	require.Equal(t, stored.SpanID(), p.Parent().SpanID(), "the stored context is the parent")
	require.True(t, p.Parent().IsRemote())
	require.Len(t, p.Links(), 1)
	require.True(t, isBatch(p.Links()[0].SpanContext), "linked to the relay's batch span")
	require.NotEqual(t, stored.TraceID(), p.Links()[0].SpanContext.TraceID(), "the batch span is a trace of its own")
	r := records["traced"]
	require.Equal(t, "00-"+stored.TraceID().String()+"-"+p.SpanContext().SpanID().String()+"-01", r.Headers["traceparent"],
		"the record carries the produce span's context")
	require.Equal(t, "vendor=1", r.Headers["tracestate"])
	require.Equal(t, traced.ID, r.EventID)

	p = produce["untraced"]
	require.False(t, p.Parent().IsValid(), "a row without a trace context starts its own trace")
	require.Len(t, p.Links(), 1)
	require.True(t, isBatch(p.Links()[0].SpanContext))
	r = records["untraced"]
	require.Equal(t, "00-"+p.SpanContext().TraceID().String()+"-"+p.SpanContext().SpanID().String()+"-01", r.Headers["traceparent"])
	require.NotContains(t, r.Headers, "tracestate")
	require.Equal(t, untraced.ID, r.EventID)
}
