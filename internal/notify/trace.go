package notify

import (
	"context"
	"strconv"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/notify/notifydb"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

// Tracing of the notifier (L4). Each record's trace continues here: the
// consume span is a child of the context the record carries (the relay's
// produce span), the apply span (the record's part of the inbox
// transaction) a child of the consume span, and the send span a child of
// the same record context, read back from the ledger row, because the
// email goes out later, in another goroutine, possibly after a restart.
//
// The spans are written here by hand rather than by franz-go's kotel
// plugin: kotel's spans follow the client's fetches ("receive" when a
// record is buffered), while the work to trace is this consumer's, which
// applies records in batches of one transaction, keeps them across a
// database outage and commits offsets only afterwards (C1).

// scopeName is the instrumentation scope of the notifier's spans.
const scopeName = "github.com/outboxref/orders/internal/notify"

// tracerOf returns the tracer of tp, or of the global provider when tp is
// nil.
func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(scopeName)
}

// remoteContext returns ctx carrying the W3C trace context stored or
// received with an event, or ctx unchanged when there is none. The record
// headers and the ledger columns hold W3C Trace Context by contract, so it
// is read with that propagator, whatever the global one is.
func remoteContext(ctx context.Context, traceparent, tracestate *string) context.Context {
	if traceparent == nil || *traceparent == "" {
		return ctx
	}
	c := propagation.MapCarrier{cloudevents.HeaderTraceparent: *traceparent}
	if tracestate != nil && *tracestate != "" {
		c[cloudevents.HeaderTracestate] = *tracestate
	}
	return propagation.TraceContext{}.Extract(ctx, c)
}

// startConsume starts the span of one record's processing, a child of the
// trace context the record carried. It ends once the record's transaction
// committed and its offset was marked (finish), or when the transaction
// failed. A record without a trace context starts a trace of its own.
func (c *Consumer) startConsume(ctx context.Context, r *kgo.Record, e inbox.Event) (context.Context, trace.Span) {
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "kafka"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.destination.name", r.Topic),
		attribute.String("messaging.consumer.group.name", c.cfg.Group),
		attribute.String("messaging.destination.partition.id", strconv.Itoa(int(r.Partition))),
		attribute.Int64("messaging.kafka.offset", r.Offset),
	}
	if e.ID != uuid.Nil {
		attrs = append(attrs,
			attribute.String("messaging.message.id", e.ID.String()),
			attribute.String("event.type", e.Type),
			attribute.String("event.aggregate_id", e.AggregateID),
			attribute.Int64("event.aggregate_version", e.AggregateVersion))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
	if e.Traceparent != "" {
		ctx = remoteContext(ctx, &e.Traceparent, &e.Tracestate)
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	return c.tracer.Start(ctx, "process "+r.Topic, opts...)
}

// startSend starts the span of one SMTP send, a child of the trace context
// stored with the ledger row: the record that asked for the email.
func (s *Sender) startSend(ctx context.Context, row notifydb.EmailSend) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("event.id", row.EventID.String()),
			attribute.String("event.type", row.EventType),
			attribute.String("email.operation_key", row.OperationKey),
			attribute.Int("email.attempt", int(row.Attempts)),
		),
	}
	if row.Traceparent != nil && *row.Traceparent != "" {
		ctx = remoteContext(ctx, row.Traceparent, row.Tracestate)
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	return s.tracer.Start(ctx, "smtp send", opts...)
}

// traceID returns the trace id of a W3C traceparent, or "" when there is
// none: the X-Trace-Id header of an email, derived from its ledger row so
// that a resend is the same email byte for byte.
func traceID(traceparent *string) string {
	if traceparent == nil || !cloudevents.ValidTraceparent(*traceparent) {
		return ""
	}
	return (*traceparent)[3:35]
}

// failSpan marks span as failed with err.
func failSpan(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}
