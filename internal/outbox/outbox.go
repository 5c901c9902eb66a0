// Package outbox implements the transactional outbox: events are written
// in the same database transaction as the business change (Writer.Insert),
// and a relay delivers them to Kafka afterwards (Relay).
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
// Relay closes the windows of delivery. It leases rows in a short claim
// transaction and sends them with no transaction open (R1); a relay that
// dies at any point leaves either an unleased row or a lease that expires,
// so a successor sends the row again with the same event_id (R3). It
// confirms a row only after the broker's acknowledgement and only while it
// still holds the lease token (R2), so a relay that stalled past its lease
// cannot overwrite its successor's claim. Broker errors and timeouts are
// unknown outcomes, retried with a backoff stored in the row (R4); events
// that can never be sent are parked (R5). Delivery is therefore at least
// once: consumers deduplicate on event_id.
//
// The package is self-contained (L1): it owns its migrations, queries and
// generated code, and imports nothing from the service that uses it, so it
// can be copied into another module with one import-path change. Its API:
//
// Writing, inside the business transaction:
//   - EventType, Ordering (Strict, Independent): the event types a service
//     emits, their delivery ordering and their JSON Schemas.
//   - Event: one event to write.
//   - NewWriter, Writer: checks events against the event types.
//   - Writer.Insert: validates and writes events in the caller's pgx.Tx;
//     Writer.Queue does the same as one statement of the caller's pgx.Batch.
//   - Writer.Validate: the same checks, without writing.
//   - MaxPayloadBytes: the payload size limit (W6).
//   - ErrInvalidEvent, ErrPayloadTooLarge, ErrUnknownEventType,
//     ErrUnknownSchemaVersion, InvalidEventError: why an event was refused.
//
// Relaying, after commit:
//   - Config, NewRelay, Relay: the relay and its settings.
//   - Relay.Run, Relay.Nudge, Relay.Owner, Relay.BrokerState, BrokerOK.
//   - DefaultBatchSize, DefaultLease, DefaultPollInterval,
//     DefaultBackoffBase, DefaultBackoffCap, DefaultMaxMessageBytes: the
//     defaults of Config's zero values.
//
// Operating:
//   - Migrations, MigrationLine: the outbox table's migrations, a goose
//     line of their own.
//   - EnsureTopic: creates the relay's topic in the background (O3).
//   - EventsOf, EventRef: which event_id the outbox wrote at each version
//     of an aggregate, archived ones included: the producer's answer to a
//     consumer that must tell its genuine events from forged ones (C7).
//   - NewStatsCollector, StatsCollector: the backlog metrics (O1).
//     NewRelay registers one itself; register your own only in a process
//     that runs no relay.
//   - ErrorClass and its Class… values, ErrorClass.Parks: why a delivery
//     failed, as stored in last_error_class and labelled in metrics.
//   - NewAdmin, Admin, Actor: the operations, each write audited with its
//     actor and reason (O4-O6): Stats, Parked, Event, Repair, Resume
//     (AdminOption, WithRepairCheck: the service's own check of a repair;
//     ErrRepairRefused); PlanReplay, ReplayPlan, ApproveReplay, RunReplay
//     with ReplayPolicy, Consumer and ReplayTarget (ErrNeedsApproval,
//     ErrApprovalExpired); ResumeReplays and WaitReplays, which continue
//     replays whose process stopped and let a stopping one record where
//     it was; Cleanup (the retention, into outbox_archive); Collector;
//     Handler and AdminHandlerConfig, the same as a JSON HTTP API.
//   - AdminClient, NewAdminClient: that API's client, one method per
//     endpoint, with its bodies (RepairRequest, ResumeRequest,
//     ResumeResult, PlanRequest, ReasonRequest, PublishModeRequest,
//     PublishModeChange) shared with the handler, and ParseSince for the
//     since parameter; errors come back as the *problem.Problem of the
//     outbox/problem package, the module's one RFC 9457 writer.
//
// Migrating from publishing inside the transaction (O7):
//   - PublishMode (ModeDirect, ModeShadow, ModeOutbox), ParsePublishMode:
//     which path sends an event type's events, stored per row.
//   - DirectPublisher, WriterOption, WithDirectPublisher: the legacy path
//     the Writer calls for types in direct or shadow mode.
//   - Admin.PublishModes, Admin.SetPublishMode, Admin.ShadowReport and
//     ShadowReport, ShadowCount, ShadowDiff, ModeSetting: switching and
//     what shadow mode found.
//   - ErrInvalidPublishMode, ErrNoDirectPublisher, ErrDirectPublish.
//
// Tracing (L4): Insert stores the W3C trace context of the span in its
// context with each row, and the relay sends each row in a produce span that
// continues it, with a link to the span of the relay's batch; the record
// carries the produce span's context to the consumer. Both use the
// OpenTelemetry API only: without an SDK installed they record nothing and
// pass the stored context through unchanged.
//
// Wire format: package cloudevents (the CloudEvents Kafka binding the relay
// writes and consumers decode).
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
	// on it. Insert generates it when zero; it is never regenerated.
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
