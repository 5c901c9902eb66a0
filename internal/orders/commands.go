package orders

import "github.com/google/uuid"

// The commands of the order service, one type each. A command carries what
// the caller asked for; a Service method of the same name runs it in one
// transaction (W1). What a command does to an order (the status it leads
// to and the events it emits, in version order) is decided in one place,
// its decide method below; the payloads are built afterwards from the row
// the transaction commits (W5, see events.go).
//
// No command carries a trace header: the context a Service method runs in
// carries the span (the API's server span), and the outbox writer stores
// its trace context with each event (L4).

// PlaceOrder creates an order for the caller (POST /orders). It emits
// order.placed at version 1.
type PlaceOrder struct {
	// Input is the order as requested; Service.Place validates it.
	Input CreateInput
	// IdempotencyKey, when not empty, makes a retry of the same request
	// return the order created first instead of a second one (S3).
	IdempotencyKey string
}

// PayOrder moves a placed order to paid (POST /orders/{id}/pay). It emits
// order.paid.
type PayOrder struct {
	ID uuid.UUID
	// ExpectedVersion is the version the client last read (If-Match).
	// Anything else is a *VersionConflictError and changes nothing.
	ExpectedVersion int64
}

// CancelOrder cancels a placed or paid order (POST /orders/{id}/cancel). It
// emits order.cancelled and, for a paid order, order.refund_requested:
// two events, two consecutive versions, one transaction (W4).
type CancelOrder struct {
	ID              uuid.UUID
	ExpectedVersion int64
}

// ShipOrder moves a paid order to shipped (POST /orders/{id}/ship). Only
// admins may run it. It emits order.shipped.
type ShipOrder struct {
	ID              uuid.UUID
	ExpectedVersion int64
}

// Command names, as logs (W7) and TransitionError give them.
const (
	placeCommand  = "place"
	payCommand    = "pay"
	cancelCommand = "cancel"
	shipCommand   = "ship"
)

// emit is one event a command emits: its type and how its payload is built
// from the order as the transaction commits it.
type emit struct {
	eventType string
	payload   func(after Order) any
}

// emits lists the events of a new order.
func (PlaceOrder) emits() []emit {
	return []emit{{EventPlaced, placedPayload}}
}

// decide allows paying a placed order only.
func (PayOrder) decide(from Status) (Status, []emit, error) {
	if from != StatusPlaced {
		return "", nil, &TransitionError{Command: payCommand, From: from}
	}
	return StatusPaid, []emit{{EventPaid, paidPayload}}, nil
}

// decide allows cancelling an order that has not shipped. A paid order's
// money goes back, which is a second event of the same command (W4).
func (CancelOrder) decide(from Status) (Status, []emit, error) {
	switch from {
	case StatusPlaced:
		return StatusCancelled, []emit{{EventCancelled, cancelledPayload(from)}}, nil
	case StatusPaid:
		return StatusCancelled, []emit{{EventCancelled, cancelledPayload(from)}, {EventRefundRequested, refundRequestedPayload}}, nil
	}
	return "", nil, &TransitionError{Command: cancelCommand, From: from}
}

// decide allows shipping a paid order only.
func (ShipOrder) decide(from Status) (Status, []emit, error) {
	if from != StatusPaid {
		return "", nil, &TransitionError{Command: shipCommand, From: from}
	}
	return StatusShipped, []emit{{EventShipped, shippedPayload}}, nil
}
