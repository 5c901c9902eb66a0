package inbox

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

// DecodeRecord turns a Kafka record written by the outbox relay (the
// CloudEvents binary-mode binding of package cloudevents) into an Event.
// The record is treated as hostile: an error wraps ErrInvalidEvent, and the
// record can never be processed, so the caller parks it (ParkRecord)
// instead of retrying. What it returns is safe to store: every text field
// is valid UTF-8 without control characters and bounded.
//
// The event's domain meaning (which types exist, which schema versions the
// consumer reads, what the payload holds) is the caller's to check.
func DecodeRecord(r *kgo.Record) (Event, error) {
	ce, err := cloudevents.Decode(r)
	if err != nil {
		return Event{}, fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	return Event{
		ID:               ce.ID,
		AggregateType:    ce.AggregateType,
		AggregateID:      ce.AggregateID,
		AggregateVersion: ce.AggregateVersion,
		Type:             ce.Type,
		Source:           ce.Source,
		SchemaVersion:    ce.SchemaVersion,
		Time:             ce.Time,
		Payload:          ce.Data,
		Traceparent:      ce.Traceparent,
		Tracestate:       ce.Tracestate,
	}, nil
}
