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

	outboxdocs "github.com/outboxref/orders/docs"
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

// DefaultSource is the ce_source the orders service writes unless its
// RELAY_CE_SOURCE says otherwise; the notifier's ORDERS_EVENT_SOURCE
// defaults to it.
const DefaultSource = "urn:outboxref:orders"

// Decoder turns Kafka records of the orders topic into inbox events, and
// admits only what the orders service could have written (C7): its
// ce_source, an order aggregate, a type and schema version this notifier
// reads, and a payload that passes the published JSON Schema of its type
// (docs/schemas, the very files the orders service validates with) and the
// notifier's own checks. Anything else is refused with an error wrapping
// errPoison or inbox.ErrInvalidEvent, and the record is parked (C6): it
// never takes a version, changes the projection or sends an email.
//
// The checks are no substitute for the broker's ACLs, which let only the
// orders service's principal write to the topic (docs/architecture.md):
// whoever can write there can forge any header. They make sure that a
// record that is not a well-formed order event never reaches the inbox,
// and the inbox asks the orders service about any event whose place is in
// doubt.
type Decoder struct {
	source  string
	schemas *inbox.Schemas
}

// NewDecoder returns a Decoder for events whose ce_source is source.
func NewDecoder(source string) (*Decoder, error) {
	if source == "" {
		return nil, errors.New("notify: the orders events' source is required")
	}
	docs := map[string]map[int][]byte{}
	for _, t := range EventTypes {
		b, err := outboxdocs.EventSchema(t, supportedSchemaVersion)
		if err != nil {
			return nil, fmt.Errorf("notify: %w", err)
		}
		docs[t] = map[int][]byte{supportedSchemaVersion: b}
	}
	schemas, err := inbox.NewSchemas(docs)
	if err != nil {
		return nil, fmt.Errorf("notify: %w", err)
	}
	return &Decoder{source: source, schemas: schemas}, nil
}

// Decode decodes and checks one record.
func (d *Decoder) Decode(r *kgo.Record) (inbox.Event, error) {
	e, err := inbox.DecodeRecord(r)
	if err != nil {
		return inbox.Event{}, err
	}
	if e.Source != d.source {
		return e, poison("ce_source %q is not the orders service's %q", e.Source, d.source)
	}
	if e.AggregateType != AggregateType {
		return e, poison("ce_aggregatetype %q is not %q", e.AggregateType, AggregateType)
	}
	if !isKnownType(e.Type) {
		// A type this notifier does not know takes no version: it is parked.
		// The aggregate's later versions are held behind the gap, then
		// resolved from the orders API once the gap window passes; after an
		// upgrade that knows the type, the parked record can be retried
		// (docs/events.md).
		return e, poison("event type %q is unknown to this notifier; it takes no version (retry it after an upgrade that knows it)", e.Type)
	}
	if e.SchemaVersion != supportedSchemaVersion {
		return e, poison("%s schema version %d is not supported (this notifier reads v%d)", e.Type, e.SchemaVersion, supportedSchemaVersion)
	}
	if err := d.schemas.Check(e); err != nil {
		return e, err
	}
	if _, err := parsePayload(e); err != nil {
		return e, err
	}
	return e, nil
}

// defaultDecoder decodes records of the orders service with its default
// source.
var defaultDecoder = func() *Decoder {
	d, err := NewDecoder(DefaultSource)
	if err != nil {
		panic(err) // the schemas are embedded: only a broken build gets here
	}
	return d
}()

// DecodeRecord is Decode with DefaultSource.
func DecodeRecord(r *kgo.Record) (inbox.Event, error) { return defaultDecoder.Decode(r) }

func isKnownType(t string) bool {
	for _, k := range EventTypes {
		if k == t {
			return true
		}
	}
	return false
}
