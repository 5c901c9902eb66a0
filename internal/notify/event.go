package notify

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/mail"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/inbox"
)

// The order event types the notifier understands (docs/schemas).
const (
	TypePlaced          = "order.placed"
	TypePaid            = "order.paid"
	TypeCancelled       = "order.cancelled"
	TypeRefundRequested = "order.refund_requested"
	TypeShipped         = "order.shipped"
)

// EventTypes lists the known order event types.
var EventTypes = []string{TypePlaced, TypePaid, TypeCancelled, TypeRefundRequested, TypeShipped}

// AggregateType is the only aggregate the notifier consumes.
const AggregateType = "order"

// supportedSchemaVersion is the payload version this code reads. A record
// with another version of a known type is parked (C6) rather than guessed
// at: a breaking change gets a new version, and reading it as v1 could
// email the wrong address.
const supportedSchemaVersion = 1

// errPoison marks a record that can never be processed. It is parked with
// the reason, and its offset committed, instead of being retried.
var errPoison = errors.New("poison record")

func poison(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errPoison, fmt.Sprintf(format, args...))
}

// The payloads, v1. Only the fields the notifier uses are declared; unknown
// fields are ignored, as the contract's additive changes require.
type (
	placedPayload struct {
		OrderID    string     `json:"order_id"`
		Customer   string     `json:"customer"`
		Email      string     `json:"email"`
		Currency   string     `json:"currency"`
		Items      []lineItem `json:"items"`
		TotalCents *int64     `json:"total_cents"`
	}
	lineItem struct {
		SKU            string `json:"sku"`
		Quantity       int64  `json:"quantity"`
		UnitPriceCents int64  `json:"unit_price_cents"`
	}
	paidPayload struct {
		OrderID    string `json:"order_id"`
		Email      string `json:"email"`
		Currency   string `json:"currency"`
		TotalCents *int64 `json:"total_cents"`
	}
	cancelledPayload struct {
		OrderID        string `json:"order_id"`
		Email          string `json:"email"`
		PreviousStatus string `json:"previous_status"`
	}
	refundRequestedPayload struct {
		OrderID     string `json:"order_id"`
		Currency    string `json:"currency"`
		AmountCents *int64 `json:"amount_cents"`
	}
	shippedPayload struct {
		OrderID string `json:"order_id"`
		Email   string `json:"email"`
	}
)

// parsePayload decodes and checks the payload of a known event type. It is
// called when the record arrives (so a bad payload is parked at once) and
// again when the event is applied, possibly much later from the hold.
func parsePayload(e inbox.Event) (any, error) {
	var (
		p        any
		orderID  *string
		email    *string
		required []string
		texts    []string // what ends up in the projection or an email
	)
	switch e.Type {
	case TypePlaced:
		v := &placedPayload{}
		p, orderID, email = v, &v.OrderID, &v.Email
		if err := json.Unmarshal(e.Payload, v); err != nil {
			return nil, poison("payload is not a %s object: %v", e.Type, err)
		}
		if v.Currency == "" || v.TotalCents == nil {
			required = append(required, "currency, total_cents")
		}
		texts = append(texts, v.Currency)
		for _, it := range v.Items {
			texts = append(texts, it.SKU)
		}
	case TypePaid:
		v := &paidPayload{}
		p, orderID, email = v, &v.OrderID, &v.Email
		if err := json.Unmarshal(e.Payload, v); err != nil {
			return nil, poison("payload is not a %s object: %v", e.Type, err)
		}
		texts = append(texts, v.Currency)
	case TypeCancelled:
		v := &cancelledPayload{}
		p, orderID, email = v, &v.OrderID, &v.Email
		if err := json.Unmarshal(e.Payload, v); err != nil {
			return nil, poison("payload is not a %s object: %v", e.Type, err)
		}
		texts = append(texts, v.PreviousStatus)
	case TypeRefundRequested:
		v := &refundRequestedPayload{}
		p, orderID = v, &v.OrderID
		if err := json.Unmarshal(e.Payload, v); err != nil {
			return nil, poison("payload is not a %s object: %v", e.Type, err)
		}
		if v.AmountCents == nil {
			required = append(required, "amount_cents")
		}
		texts = append(texts, v.Currency)
	case TypeShipped:
		v := &shippedPayload{}
		p, orderID, email = v, &v.OrderID, &v.Email
		if err := json.Unmarshal(e.Payload, v); err != nil {
			return nil, poison("payload is not a %s object: %v", e.Type, err)
		}
	default:
		return nil, nil // not ours to read; the caller decides
	}
	if len(required) > 0 {
		return nil, poison("%s payload lacks %s", e.Type, strings.Join(required, ", "))
	}
	if *orderID != e.AggregateID {
		return nil, poison("payload order_id %q does not match the aggregate id %q", *orderID, e.AggregateID)
	}
	for _, t := range texts {
		if !printable(t) {
			// JSON may carry any code point (\u0000 included); a text column,
			// an email header or body must not.
			return nil, poison("%s payload holds a field that is not printable text of at most %d bytes", e.Type, maxFieldBytes)
		}
	}
	if email != nil {
		addr, err := mail.ParseAddress(*email)
		if err != nil || addr.Name != "" || !printable(addr.Address) || addr.Address == "" {
			// Never guess a recipient: a malformed address here would
			// otherwise surface as a permanent SMTP failure much later.
			return nil, poison("%s payload has no valid email address", e.Type)
		}
		*email = addr.Address
	}
	return p, nil
}

// maxFieldBytes bounds one text field of a payload.
const maxFieldBytes = 256

// printable reports whether s is valid UTF-8 without control characters
// and at most maxFieldBytes long (empty is fine: required fields are
// checked on their own).
func printable(s string) bool {
	return len(s) <= maxFieldBytes && utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0
}

// DecodeRecord turns a Kafka record of the orders topic into an inbox
// event. The record format is the outbox's CloudEvents binding, decoded and
// checked by the inbox; this adds what is specific to orders: the
// aggregate type, the schema versions this code reads, and a payload that
// parses. An error wrapping errPoison or inbox.ErrInvalidEvent means the
// record can never be processed and must be parked.
func DecodeRecord(r *kgo.Record) (inbox.Event, error) {
	e, err := inbox.DecodeRecord(r)
	if err != nil {
		return inbox.Event{}, err
	}
	if e.AggregateType != AggregateType {
		return e, poison("ce_aggregatetype %q is not %q", e.AggregateType, AggregateType)
	}
	if !isKnownType(e.Type) {
		// An event type added after this code was written still takes a
		// version number in the aggregate's sequence; it passes through the
		// inbox (so later versions are not stuck behind it) and changes
		// nothing here.
		return e, nil
	}
	if e.SchemaVersion != supportedSchemaVersion {
		return e, poison("%s schema version %d is not supported (this notifier reads v%d)", e.Type, e.SchemaVersion, supportedSchemaVersion)
	}
	if _, err := parsePayload(e); err != nil {
		return e, err
	}
	return e, nil
}

func isKnownType(t string) bool {
	for _, k := range EventTypes {
		if k == t {
			return true
		}
	}
	return false
}
