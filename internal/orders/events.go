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

// EventTypes describes the order events to the outbox writer and relay.
// Their schemas are the ones published in docs/schemas. Order events are
// strict: a consumer must see an order's versions in order, and a parked
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

// The payload builders, one per event type, for the commands' emit lists.
// after is the order as the transaction commits it (the RETURNING row), so
// a payload never holds a value that was not committed (W5).

func placedPayload(o Order) any {
	return placedV1{OrderID: o.ID.String(), Customer: o.Customer, Email: o.Email, Currency: o.Currency,
		Items: o.Items, TotalCents: o.TotalCents, PlacedAt: o.CreatedAt}
}

func paidPayload(o Order) any {
	return paidV1{OrderID: o.ID.String(), Email: o.Email, Currency: o.Currency, TotalCents: o.TotalCents, PaidAt: o.UpdatedAt}
}

// cancelledPayload needs the status the order had before the command,
// which the committed row no longer holds.
func cancelledPayload(previous Status) func(Order) any {
	return func(o Order) any {
		return cancelledV1{OrderID: o.ID.String(), Email: o.Email, PreviousStatus: previous, CancelledAt: o.UpdatedAt}
	}
}

func refundRequestedPayload(o Order) any {
	return refundRequestedV1{OrderID: o.ID.String(), Currency: o.Currency, AmountCents: o.TotalCents, RequestedAt: o.UpdatedAt}
}

func shippedPayload(o Order) any {
	return shippedV1{OrderID: o.ID.String(), Email: o.Email, ShippedAt: o.UpdatedAt}
}

// toEvents builds the outbox events of a command from the order as the
// transaction commits it. The command moved the order to after.Version by
// one version per event, so its events take the versions that lead there,
// consecutive and in the command's order (W4): a command emitting k events
// moves the order from v to v+k and its events are v+1..v+k.
func toEvents(emits []emit, after Order) ([]outbox.Event, error) {
	first := after.Version - int64(len(emits)) + 1
	events := make([]outbox.Event, len(emits))
	for i, em := range emits {
		b, err := json.Marshal(em.payload(after))
		if err != nil {
			return nil, fmt.Errorf("encode %s payload: %w", em.eventType, err)
		}
		events[i] = outbox.Event{
			AggregateType:    AggregateType,
			AggregateID:      after.ID.String(),
			AggregateVersion: first + int64(i),
			Type:             em.eventType,
			SchemaVersion:    schemaVersion,
			Payload:          b,
		}
	}
	return events, nil
}
