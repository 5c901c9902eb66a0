package notify

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/mail"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
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
	case TypePaid:
		v := &paidPayload{}
		p, orderID, email = v, &v.OrderID, &v.Email
		if err := json.Unmarshal(e.Payload, v); err != nil {
			return nil, poison("payload is not a %s object: %v", e.Type, err)
		}
	case TypeCancelled:
		v := &cancelledPayload{}
		p, orderID, email = v, &v.OrderID, &v.Email
		if err := json.Unmarshal(e.Payload, v); err != nil {
			return nil, poison("payload is not a %s object: %v", e.Type, err)
		}
	case TypeRefundRequested:
		v := &refundRequestedPayload{}
		p, orderID = v, &v.OrderID
		if err := json.Unmarshal(e.Payload, v); err != nil {
			return nil, poison("payload is not a %s object: %v", e.Type, err)
		}
		if v.AmountCents == nil {
			required = append(required, "amount_cents")
		}
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
	if email != nil {
		addr, err := mail.ParseAddress(*email)
		if err != nil || addr.Name != "" {
			// Never guess a recipient: a malformed address here would
			// otherwise surface as a permanent SMTP failure much later.
			return nil, poison("%s payload has no valid email address", e.Type)
		}
		*email = addr.Address
	}
	return p, nil
}

// CloudEvents binary-mode header names (R7).
const (
	hdrSpecVersion      = "ce_specversion"
	hdrID               = "ce_id"
	hdrType             = "ce_type"
	hdrSubject          = "ce_subject"
	hdrTime             = "ce_time"
	hdrAggregateType    = "ce_aggregatetype"
	hdrAggregateVersion = "ce_aggregateversion"
	hdrSchemaVersion    = "ce_schemaversion"
	hdrContentType      = "content-type"
)

// DecodeRecord turns a Kafka record in the orders relay's CloudEvents
// binary format into an inbox event. An error wrapping errPoison means the
// record can never be processed and must be parked.
func DecodeRecord(r *kgo.Record) (inbox.Event, error) {
	h := make(map[string]string, len(r.Headers))
	for _, kv := range r.Headers {
		h[strings.ToLower(kv.Key)] = string(kv.Value)
	}
	if v := h[hdrSpecVersion]; v != "1.0" {
		return inbox.Event{}, poison("ce_specversion %q is not 1.0", v)
	}
	id, err := uuid.Parse(h[hdrID])
	if err != nil {
		return inbox.Event{}, poison("ce_id %q is not a UUID", h[hdrID])
	}
	e := inbox.Event{ID: id, Type: h[hdrType], AggregateType: h[hdrAggregateType], Payload: r.Value}
	if e.Type == "" {
		return e, poison("ce_type is missing")
	}
	if e.AggregateType != AggregateType {
		return e, poison("ce_aggregatetype %q is not %q", e.AggregateType, AggregateType)
	}
	e.AggregateID = string(r.Key)
	if e.AggregateID == "" {
		e.AggregateID = h[hdrSubject]
	}
	if e.AggregateID == "" || (h[hdrSubject] != "" && h[hdrSubject] != e.AggregateID) {
		return e, poison("record key %q and ce_subject %q do not name one aggregate", r.Key, h[hdrSubject])
	}
	if e.AggregateVersion, err = strconv.ParseInt(h[hdrAggregateVersion], 10, 64); err != nil || e.AggregateVersion < 1 {
		return e, poison("ce_aggregateversion %q is not a positive integer", h[hdrAggregateVersion])
	}
	sv, err := strconv.Atoi(h[hdrSchemaVersion])
	if err != nil || sv < 1 {
		return e, poison("ce_schemaversion %q is not a positive integer", h[hdrSchemaVersion])
	}
	e.SchemaVersion = sv
	switch t := h[hdrTime]; {
	case t == "":
		e.Time = r.Timestamp
	default:
		if e.Time, err = time.Parse(time.RFC3339Nano, t); err != nil {
			return e, poison("ce_time %q is not RFC 3339", t)
		}
	}
	if ct := h[hdrContentType]; ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return e, poison("content-type %q is not application/json", ct)
		}
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
