// Package outbox implements the write side of the transactional outbox:
// events are written in the same database transaction as the business
// change (Writer.Insert), and a relay delivers them to Kafka afterwards.
//
// Writer.Insert closes the dual-write window: because the event row commits
// or rolls back with the business row, there is no moment at which the
// database holds a change the broker will never hear about, or the broker
// holds an event for a change that rolled back. It also refuses, before
// anything is written, an event the relay could never deliver, so a bad
// event fails its command instead of blocking its aggregate later (L2).
// The package knows nothing about the business domain; services describe
// their event types with EventType.
//
// The unit is split by audience, the way riverqueue/river keeps its
// client's insert in its root package and the rest in packages of their
// own. A service that only writes events imports this package alone:
//   - package relay (internal/outbox/relay): the process that delivers the
//     committed rows to Kafka, at least once and in order (R1-R9), and the
//     backlog metrics.
//   - package operate (internal/outbox/operate): the on-call engineer's
//     operations (repair, resume, replay, retention cleanup, publish
//     modes), their HTTP API and its typed client.
//   - package cloudevents: the record format the relay writes and
//     consumers decode.
//   - internal/: the generated queries of the write side and the relay
//     (outboxdb) and what the packages above share; Go's internal rule
//     keeps them private to the unit. The operations' queries are
//     operate's own (operate/queries, generated into
//     operate/internal/opsdb), so the write side and the relay can be
//     copied without them.
//
// The unit is self-contained (L1): it owns its migrations, queries and
// generated code, and imports nothing from the service that uses it, so it
// can be copied into another module with one import-path change. This
// package's API:
//
// Writing, inside the business transaction:
//   - EventType, Ordering (Strict, Independent): the event types a service
//     emits, their delivery ordering and their JSON Schemas. The relay is
//     given the same list.
//   - Event: one event to write.
//   - NewWriter, Writer: checks events against the event types.
//   - Writer.Insert: validates and writes events in the caller's pgx.Tx;
//     Writer.Queue does the same as one statement of the caller's pgx.Batch.
//   - Writer.QueueOneTrip: the same for a batch sent outside any explicit
//     transaction, which PostgreSQL runs as one implicit transaction: the
//     business change, its events and the commit in one round trip.
//     NeedsTransaction: the batch's refusal of a type in direct or shadow
//     publish mode, which needs an explicit transaction.
//   - Writer.Validate: the same checks, without writing, and always
//     against the JSON Schemas, which Insert, Queue and QueueOneTrip
//     check only for a Writer built with WithSchemaCheckOnInsert.
//   - MaxPayloadBytes: the payload size limit (W6).
//   - ErrInvalidEvent, ErrPayloadTooLarge, ErrUnknownEventType,
//     ErrUnknownSchemaVersion, InvalidEventError: why an event was refused.
//
// Migrating from publishing inside the transaction (O7):
//   - DirectPublisher, WriterOption, WithDirectPublisher: the legacy path
//     the Writer calls for event types an operator switched to direct or
//     shadow mode (operate.PublishMode); ErrNoDirectPublisher,
//     ErrDirectPublish.
//
// Setting up and answering consumers:
//   - Migrations, MigrationLine: the outbox table's migrations, a goose
//     line of their own.
//   - EventsOf, EventRef, DB: which event_id the outbox wrote at each
//     version of an aggregate, archived ones included: the producer's
//     answer to a consumer that must tell its genuine events from forged
//     ones (C7), read through a pool, connection or transaction.
//
// Tracing (L4): Insert stores the W3C trace context of the span in its
// context with each row, and the relay continues it when it sends the row.
// It uses the OpenTelemetry API only: without an SDK installed nothing is
// recorded.
package outbox

import (
	"encoding/json"

	"github.com/google/uuid"
)

// Event is one integration event, written in the business transaction.
//
// Consumers (an inbox, internal/inbox here) rely on the versions: an
// aggregate's events are numbered from 1, consecutively, with no gaps, in
// the order the changes committed. A consumer applies version n+1 only
// after n, treats a version it has seen as a duplicate, and holds a gap
// until it gives up and resynchronises. So the caller fixes the versions
// inside the transaction, from the aggregate's own version column, and a
// command that emits several events writes them in one Insert call with
// consecutive versions (W4). The unique constraint on (aggregate_type,
// aggregate_id, aggregate_version) refuses a version written twice.
type Event struct {
	// ID is the event's identity for its whole life: consumers deduplicate
	// on it. Insert generates it when zero, as a UUIDv7; it is never
	// regenerated. An id set by the caller should be time-ordered too: the
	// relay marks events delivered in the order they were written, and
	// each of those updates adds a primary-key entry next to the old one,
	// so random ids spread a backlog's drain over the whole index.
	ID uuid.UUID
	// AggregateType and AggregateID name the aggregate that changed; the
	// ID is the Kafka key, so one aggregate's events share a partition.
	AggregateType string
	AggregateID   string
	// AggregateVersion is the aggregate's version after this event: 1 for
	// its first event, then consecutive.
	AggregateVersion int64
	// Type is a registered EventType's Name, and SchemaVersion one of its
	// schema versions.
	Type          string
	SchemaVersion int
	// Payload is the public JSON contract, built from the values being
	// committed in the same transaction (W5), at most MaxPayloadBytes.
	Payload json.RawMessage
	// Traceparent and Tracestate are the W3C trace context the event
	// continues (L4); the relay's produce span is their child. Leave them
	// empty, the usual case: Insert takes them from the span in its ctx
	// (OpenTelemetry; in an HTTP service, typically the server span), so a
	// service does not thread trace headers through its commands. Set them
	// only to carry a context the caller holds without OpenTelemetry, such
	// as one read by hand from an incoming message: Insert then keeps them
	// as they are. Tracestate needs Traceparent.
	Traceparent string
	Tracestate  string
}
