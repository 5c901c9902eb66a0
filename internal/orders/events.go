package orders

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/outboxref/orders/docs"
	"github.com/outboxref/orders/internal/outbox"
)

// AggregateType is the outbox aggregate_type of every order event.
const AggregateType = "order"

// The order event types. Each is a documented contract (docs/events.md) with
// a JSON Schema per version in docs/schemas.
const (
	EventPlaced          = "order.placed"
	EventPaid            = "order.paid"
	EventCancelled       = "order.cancelled"
	EventRefundRequested = "order.refund_requested"
	EventShipped         = "order.shipped"
)

// schemaVersion is the payload version all order events are written with.
// Additive changes keep it; a breaking change gets a new version (W5).
const schemaVersion = 1

// EventTypes describes the order events to the outbox relay. Order events
// are strict: a consumer must see an order's versions in order, and a parked
// event blocks the later events of its order rather than being overtaken.
func EventTypes() ([]outbox.EventType, error) {
	var out []outbox.EventType
	for _, name := range []string{EventPlaced, EventPaid, EventCancelled, EventRefundRequested, EventShipped} {
		s, err := docs.EventSchema(name, schemaVersion)
		if err != nil {
			return nil, err
		}
		out = append(out, outbox.EventType{Name: name, Ordering: outbox.Strict, Schemas: map[int][]byte{schemaVersion: s}})
	}
	return out, nil
}

// Payloads (schema version 1). They carry only what consumers need: no
// internal columns, no credentials. The email address is included because
// the notification consumer needs it to do its job.

type placedV1 struct {
	OrderID    string    `json:"order_id"`
	Customer   string    `json:"customer"`
	Email      string    `json:"email"`
	Currency   string    `json:"currency"`
	Items      []Line    `json:"items"`
	TotalCents int64     `json:"total_cents"`
	PlacedAt   time.Time `json:"placed_at"`
}

type paidV1 struct {
	OrderID    string    `json:"order_id"`
	Email      string    `json:"email"`
	Currency   string    `json:"currency"`
	TotalCents int64     `json:"total_cents"`
	PaidAt     time.Time `json:"paid_at"`
}

type cancelledV1 struct {
	OrderID        string    `json:"order_id"`
	Email          string    `json:"email"`
	PreviousStatus Status    `json:"previous_status"`
	CancelledAt    time.Time `json:"cancelled_at"`
}

type refundRequestedV1 struct {
	OrderID     string    `json:"order_id"`
	Currency    string    `json:"currency"`
	AmountCents int64     `json:"amount_cents"`
	RequestedAt time.Time `json:"requested_at"`
}

type shippedV1 struct {
	OrderID   string    `json:"order_id"`
	Email     string    `json:"email"`
	ShippedAt time.Time `json:"shipped_at"`
}

// eventsFor returns the events of a command, built from the order as the
// transaction is committing it (after is the RETURNING row). The versions
// are fixed here, inside the transaction: a command emitting k events moves
// the order from version v to v+k and its events take v+1..v+k (W4).
func eventsFor(command string, before Status, after Order, traceparent string) ([]outbox.Event, error) {
	id := after.ID.String()
	var payloads []struct {
		typ string
		v   any
	}
	add := func(typ string, v any) {
		payloads = append(payloads, struct {
			typ string
			v   any
		}{typ, v})
	}
	at := after.UpdatedAt
	switch command {
	case CommandCreate:
		add(EventPlaced, placedV1{OrderID: id, Customer: after.Customer, Email: after.Email, Currency: after.Currency,
			Items: after.Items, TotalCents: after.TotalCents, PlacedAt: after.CreatedAt})
	case CommandPay:
		add(EventPaid, paidV1{OrderID: id, Email: after.Email, Currency: after.Currency, TotalCents: after.TotalCents, PaidAt: at})
	case CommandShip:
		add(EventShipped, shippedV1{OrderID: id, Email: after.Email, ShippedAt: at})
	case CommandCancel:
		add(EventCancelled, cancelledV1{OrderID: id, Email: after.Email, PreviousStatus: before, CancelledAt: at})
		if before == StatusPaid {
			add(EventRefundRequested, refundRequestedV1{OrderID: id, Currency: after.Currency, AmountCents: after.TotalCents, RequestedAt: at})
		}
	default:
		return nil, fmt.Errorf("no events defined for command %q", command)
	}
	first := after.Version - int64(len(payloads)) + 1
	events := make([]outbox.Event, len(payloads))
	for i, p := range payloads {
		b, err := json.Marshal(p.v)
		if err != nil {
			return nil, fmt.Errorf("encode %s payload: %w", p.typ, err)
		}
		events[i] = outbox.Event{
			AggregateType:    AggregateType,
			AggregateID:      id,
			AggregateVersion: first + int64(i),
			Type:             p.typ,
			SchemaVersion:    schemaVersion,
			Payload:          b,
			Traceparent:      traceparent,
		}
	}
	return events, nil
}

// eventCount is how many events, and so versions, a command adds.
func eventCount(command string, before Status) int64 {
	if command == CommandCancel && before == StatusPaid {
		return 2
	}
	return 1
}
