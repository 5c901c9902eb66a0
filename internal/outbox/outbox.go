// Package outbox implements the transactional outbox: events are written in
// the same database transaction as the business change (Insert), and a relay
// delivers them to Kafka afterwards (Relay).
//
// Insert closes the dual-write window: because the event row commits or rolls
// back with the business row, there is no moment at which the database holds
// a change the broker will never hear about, or the broker holds an event for
// a change that rolled back. The package knows nothing about the business
// domain; services describe their event types with EventType.
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
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/outboxref/orders/internal/outbox/outboxdb"
)

// MaxPayloadBytes bounds one event's payload at write time (W6). Large
// content belongs behind an immutable reference, not in the outbox.
const MaxPayloadBytes = 256 << 10

// ErrPayloadTooLarge is returned by Insert for a payload over MaxPayloadBytes.
var ErrPayloadTooLarge = errors.New("outbox: event payload too large")

// Event is one integration event, written in the business transaction.
type Event struct {
	// ID is the event's identity for its whole life: consumers deduplicate
	// on it. Insert generates it when zero; it is never regenerated.
	ID               uuid.UUID
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	Type             string
	SchemaVersion    int
	// Payload is the public JSON contract, built from the values being
	// committed in the same transaction (W5).
	Payload json.RawMessage
	// Traceparent is the W3C trace context of the request, if any.
	Traceparent string
}

// Insert writes events inside the caller's transaction, in one statement.
// The unique constraint on (aggregate_type, aggregate_id, aggregate_version)
// makes a second writer of the same version fail, and with it the whole
// business transaction. Insert fills in missing event IDs in place.
func Insert(ctx context.Context, tx outboxdb.DBTX, events []Event) error {
	if len(events) == 0 {
		return nil
	}
	p := outboxdb.OutboxInsertParams{}
	for i := range events {
		e := &events[i]
		if len(e.Payload) > MaxPayloadBytes {
			return fmt.Errorf("%w: %s v%d is %d bytes (limit %d)", ErrPayloadTooLarge, e.Type, e.AggregateVersion, len(e.Payload), MaxPayloadBytes)
		}
		if e.ID == uuid.Nil {
			id, err := uuid.NewV7()
			if err != nil {
				return fmt.Errorf("generate event id: %w", err)
			}
			e.ID = id
		}
		p.EventIDs = append(p.EventIDs, e.ID)
		p.AggregateTypes = append(p.AggregateTypes, e.AggregateType)
		p.AggregateIDs = append(p.AggregateIDs, e.AggregateID)
		p.AggregateVersions = append(p.AggregateVersions, e.AggregateVersion)
		p.EventTypes = append(p.EventTypes, e.Type)
		p.SchemaVersions = append(p.SchemaVersions, int32(e.SchemaVersion))
		p.Payloads = append(p.Payloads, e.Payload)
		p.Traceparents = append(p.Traceparents, e.Traceparent)
	}
	if err := outboxdb.New(tx).OutboxInsert(ctx, p); err != nil {
		return fmt.Errorf("insert outbox events: %w", err)
	}
	return nil
}
