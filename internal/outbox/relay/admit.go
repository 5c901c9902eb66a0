package relay

import (
	"fmt"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/internal/eventtypes"
)

// admit is the relay's guard before it sends a row (R5): the row's type
// and schema version must be ones this relay was configured with. Both
// failures are deterministic, so the caller parks the row instead of
// retrying it.
//
// The payload is deliberately not checked here. The Writer validated it
// against the same JSON Schema inside the business transaction; the column
// is jsonb, so PostgreSQL already guarantees it is well-formed JSON; and a
// published schema version is never changed to reject payloads it used to
// accept (docs/events.md), so a payload valid when written stays valid. Validating every payload again would
// cost each send a JSON decode and a schema walk to re-prove all that.
// What admit guards against is rows this relay cannot know: written by
// older or newer code during a rolling deploy, or by hand. Whoever writes
// rows without the Writer (a repair of a parked row, O4) checks them with
// Writer.Validate first.
func admit(types *eventtypes.Set, eventType string, schemaVersion int) (ErrorClass, error) {
	t, ok := types.Lookup(eventType)
	if !ok {
		// During a rolling deploy an older relay may meet a type that only
		// newer code knows: the row is parked and can be resumed, with the
		// same event_id, once every relay runs the new code (O4).
		return ClassUnknownEventType, fmt.Errorf("event type %q is not known to this relay", eventType)
	}
	if _, ok := t.Schema(schemaVersion); !ok {
		return ClassUnknownSchemaVersion, fmt.Errorf("event type %q has no schema version %d in this relay", eventType, schemaVersion)
	}
	return "", nil
}

// specs describes types to package eventtypes, as package outbox does for
// its Writer: the Writer and the relay compile the same list the same way.
func specs(types []outbox.EventType) []eventtypes.Spec {
	out := make([]eventtypes.Spec, len(types))
	for i, t := range types {
		out[i] = eventtypes.Spec{Name: t.Name, Ordering: int(t.Ordering), Schemas: t.Schemas}
	}
	return out
}
