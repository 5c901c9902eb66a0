package relay

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/orders/internal/outbox/internal/w3c"
)

// Tracing of the outbox (L4). A row stores the trace context it was written
// under; the relay sends it in a produce span that continues that trace, so
// one trace id runs from the request that wrote the event to whatever the
// consumer does with it, however long the row waited and whichever relay
// sent it.
//
// The spans are written here by hand rather than by franz-go's kotel
// plugin. kotel starts its produce span from the record's context, which
// could carry the row's trace, but it cannot link that span to the relay's
// batch span, and its hooks act on every record of the client with the
// global propagator (adding a baggage header the CloudEvents binding does
// not define). The outbox owns its record headers (package cloudevents):
// here the header is the produce span's context, written once, in W3C form.

// scopeName is the instrumentation scope of the outbox's spans.
const scopeName = "github.com/outboxref/orders/internal/outbox"

// startBatch starts the span of one claimed batch, from the start of its
// claim. It is a root span: a batch mixes the events of many traces and
// belongs to none of them. Each produce span links to it instead, so a
// trace shows which relay sent the event in which batch, and the batch
// shows what held it up (the claim, the broker, the confirm).
func (r *Relay) startBatch(ctx context.Context, claimedAt time.Time, size int) (context.Context, trace.Span) {
	return r.tracer.Start(ctx, "outbox relay batch",
		trace.WithNewRoot(),
		trace.WithTimestamp(claimedAt),
		trace.WithAttributes(
			attribute.Int("outbox.batch.size", size),
			attribute.String("outbox.lease_owner", r.cfg.Owner),
		))
}

// startProduce starts the produce span of one row: a child of the context
// stored with the row, so the row's trace continues, linked to the batch
// span in ctx. A row stored without a trace context starts a trace of its
// own. ctx also keeps its deadline, which the send obeys.
//
// The span starts with what a sampler may decide on (its kind, the
// messaging system, operation and destination, its parent and link); the
// attributes of the row itself are added only when the span records. With
// no OpenTelemetry SDK, or a sampler that drops the trace, building them
// would be a dozen allocations per event for nothing.
func (r *Relay) startProduce(ctx context.Context, l *leased) (context.Context, trace.Span) {
	opts := append(make([]trace.SpanStartOption, 0, len(r.produceOpts)+2), r.produceOpts...)
	if batch := trace.SpanContextFromContext(ctx); batch.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: batch}))
	}
	if sc := w3c.SpanContext(l.traceparent, l.tracestate); sc.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	ctx, span := r.tracer.Start(ctx, r.produceName, opts...)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("messaging.message.id", l.EventID.String()),
			attribute.String("messaging.kafka.message.key", l.AggregateID),
			attribute.String("outbox.event_type", l.EventType),
			attribute.String("outbox.aggregate_type", l.AggregateType),
			attribute.Int64("outbox.aggregate_version", l.AggregateVersion),
			attribute.Int("outbox.attempt", l.Attempts+1),
		)
	}
	return ctx, span
}

// produceStart returns the name of the produce spans and the options every
// one of them starts with, made once per relay.
func produceStart(topic string) (string, []trace.SpanStartOption) {
	return "send " + topic, []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.operation.name", "send"),
			attribute.String("messaging.destination.name", topic),
		),
	}
}

// endProduce ends the produce span of an outcome once the broker answered
// or the deadline passed.
func endProduce(o *outcome) {
	if o.span == nil {
		return
	}
	if !o.span.IsRecording() {
		o.span.End()
		return
	}
	if o.Err != nil {
		o.span.RecordError(o.Err)
		o.span.SetStatus(codes.Error, string(o.Class))
	} else {
		o.span.SetAttributes(
			attribute.String("messaging.destination.partition.id", strconv.Itoa(int(o.Partition))),
			attribute.Int64("messaging.kafka.offset", o.Offset),
		)
	}
	o.span.End()
}

// logContext returns ctx with the event's produce span, so that the logs
// about one event carry its trace_id and span_id.
func (o *outcome) logContext(ctx context.Context) context.Context {
	if o.span == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, o.span)
}
