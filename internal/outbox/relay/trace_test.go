package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/orders/internal/outbox"
)

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
	e.WaitDelivered(t, 10*time.Second)
	records := map[string]record{}
	for _, r := range e.ReadAll(t) {
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
	attrs := map[attribute.Key]attribute.Value{}
	for _, a := range p.Attributes() {
		attrs[a.Key] = a.Value
	}
	require.Equal(t, "kafka", attrs["messaging.system"].AsString())
	require.Equal(t, topic, attrs["messaging.destination.name"].AsString())
	require.Equal(t, traced.ID.String(), attrs["messaging.message.id"].AsString())
	require.Equal(t, int64(1), attrs["outbox.aggregate_version"].AsInt64())
	require.Equal(t, int64(1), attrs["outbox.attempt"].AsInt64())
	require.Contains(t, attrs, attribute.Key("messaging.kafka.offset"), "the broker's answer is on the span")

	p = produce["untraced"]
	require.False(t, p.Parent().IsValid(), "a row without a trace context starts its own trace")
	require.Len(t, p.Links(), 1)
	require.True(t, isBatch(p.Links()[0].SpanContext))
	r = records["untraced"]
	require.Equal(t, "00-"+p.SpanContext().TraceID().String()+"-"+p.SpanContext().SpanID().String()+"-01", r.Headers["traceparent"])
	require.NotContains(t, r.Headers, "tracestate")
	require.Equal(t, untraced.ID, r.EventID)
}
