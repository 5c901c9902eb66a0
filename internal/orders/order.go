// Package orders is the order aggregate and its application service.
//
// Each command is a type of its own (PlaceOrder, PayOrder, CancelOrder,
// ShipOrder), run by the Service method of the same name; what it does to
// an order and which events it emits is decided in one place per command
// (commands.go). Every command runs in one short database transaction
// (W1): a conditional UPDATE on (id, version), or an INSERT to place an
// order, then the outbox rows for the events it emits, built from the
// values the transaction is committing (W5) and checked by the outbox
// writer against the published schemas. If any step fails, the business
// change and its events roll back together, so there is no window in
// which one exists without the other.
package orders

import (
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Status is an order's lifecycle state.
type Status string

// The order states. The machine is placed -> paid -> shipped, and
// placed|paid -> cancelled.
const (
	StatusPlaced    Status = "placed"
	StatusPaid      Status = "paid"
	StatusShipped   Status = "shipped"
	StatusCancelled Status = "cancelled"
)

// Limits on a new order (W6: bounded input, bounded events).
const (
	MaxLines          = 100
	MaxSKULength      = 64
	MaxQuantity       = 10_000
	MaxUnitPrice      = 100_000_000 // cents per unit
	MaxEmailLength    = 254
	MaxPageSize       = 100
	maxIdempotencyKey = 255
)

// Order is the aggregate as the API returns it.
type Order struct {
	ID         uuid.UUID `json:"id"`
	Customer   string    `json:"customer"`
	Email      string    `json:"email"`
	Currency   string    `json:"currency"`
	Items      []Line    `json:"items"`
	TotalCents int64     `json:"total_cents"`
	Status     Status    `json:"status"`
	Version    int64     `json:"version"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// Line is one order line.
type Line struct {
	SKU            string `json:"sku"`
	Quantity       int32  `json:"quantity"`
	UnitPriceCents int64  `json:"unit_price_cents"`
}

// Errors returned by the service. The HTTP layer maps them to statuses.
var (
	// ErrNotFound: no such order, or not visible to the caller.
	ErrNotFound = errors.New("order not found")
	// ErrForbidden: the caller may see the order but not run the command.
	ErrForbidden = errors.New("not allowed for this role")
	// ErrIdempotencyKeyReused: the key was used with a different body.
	ErrIdempotencyKeyReused = errors.New("idempotency key reused with a different request")
	// ErrCommitUnknown: the connection failed during COMMIT, so whether the
	// command took effect is unknown. A client may re-read the order.
	ErrCommitUnknown = errors.New("commit outcome unknown")
	// ErrUnavailable: the database connection failed, or the database
	// refused the work for a passing reason (shut down, too many
	// connections, a deadlock), before the commit was sent; or, for an
	// event type in direct publish mode, the broker did not take the
	// event. Nothing was committed and the command can be retried as is.
	ErrUnavailable = errors.New("temporarily unavailable; nothing was committed")
	// ErrEventTooLarge: an event of the command would exceed the outbox's
	// payload limit (W6). Nothing was written; the request must carry less.
	ErrEventTooLarge = errors.New("order event too large for the outbox")
)

// VersionConflictError reports that the caller's expected version is stale.
type VersionConflictError struct {
	Expected, Current int64
}

func (e *VersionConflictError) Error() string {
	return fmt.Sprintf("version conflict: expected %d, current %d", e.Expected, e.Current)
}

// TransitionError reports a command that the current status does not allow.
type TransitionError struct {
	Command string
	From    Status
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("cannot %s an order that is %s", e.Command, e.From)
}

// FieldError is one invalid input field.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// ValidationError lists every invalid field of a request.
type ValidationError struct {
	Fields []FieldError
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("invalid request: %d invalid fields", len(e.Fields))
}
