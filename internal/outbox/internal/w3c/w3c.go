// Package w3c reads and writes the W3C trace context the outbox stores
// with each row (L4): the Writer takes it from the span in the caller's
// context, and the relay continues it in the span that sends the row.
package w3c

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

// propagator reads and writes the traceparent column and headers. Their
// format is W3C Trace Context by contract, so they do not follow the
// service's global propagator, which may be configured for other formats
// or add baggage.
var propagator = propagation.TraceContext{}

// FromContext returns the W3C traceparent and tracestate of the span in
// ctx, or two empty strings when ctx holds no valid span context. A
// tracestate the record header could not carry is dropped: the trace
// context must never cost an event.
func FromContext(ctx context.Context) (traceparent, tracestate string) {
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	traceparent, tracestate = c[cloudevents.HeaderTraceparent], c[cloudevents.HeaderTracestate]
	if !cloudevents.ValidTraceparent(traceparent) {
		return "", ""
	}
	if !cloudevents.ValidTracestate(tracestate) {
		tracestate = ""
	}
	return traceparent, tracestate
}

// SpanContext parses the trace context stored with a row. It is not
// valid when the row has none or holds one that W3C parsing refuses (an
// all-zero trace id, say).
func SpanContext(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	c := propagation.MapCarrier{cloudevents.HeaderTraceparent: traceparent}
	if tracestate != "" {
		c[cloudevents.HeaderTracestate] = tracestate
	}
	return trace.SpanContextFromContext(propagator.Extract(context.Background(), c))
}
