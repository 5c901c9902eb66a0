package outbox

import "github.com/outboxref/orders/internal/outbox/internal/eventtypes"

// Ordering is an event type's delivery ordering policy within its aggregate
// (R6). It is chosen per event type, in code, never left to scan order.
type Ordering int

const (
	// Strict means a later version of an aggregate is never claimed while
	// an earlier version is undelivered: pending, leased or parked. A parked
	// head blocks its aggregate and raises the blocked metric.
	Strict Ordering = iota
	// Independent means the event may be delivered regardless of the
	// aggregate's earlier undelivered events.
	Independent
)

// String returns the policy's name as used in logs and docs.
func (o Ordering) String() string {
	switch o {
	case Strict:
		return "strict"
	case Independent:
		return "independent"
	default:
		return "unknown"
	}
}

// EventType describes one event type to the Writer and the relay
// (relay.Config.Types). A service keeps one list of them and gives it to
// both.
type EventType struct {
	// Name is the event type, e.g. "invoice.issued" (the CloudEvents type):
	// printable UTF-8 of at most cloudevents.MaxTypeBytes.
	Name string
	// Ordering is the delivery policy within an aggregate.
	Ordering Ordering
	// Schemas maps each schema version (1 or more) to its JSON Schema
	// document. The Writer refuses a payload that fails it (R5, L2); the
	// relay parks a row whose type or schema version is missing here. A
	// published version's schema is never changed to reject payloads it
	// accepted, since rows already written rely on it: a breaking change
	// is a new version.
	Schemas map[int][]byte
}

// specs describes types to package eventtypes, which compiles them for
// the Writer (and, from its own copy of this mapping, for the relay).
func specs(types []EventType) []eventtypes.Spec {
	out := make([]eventtypes.Spec, len(types))
	for i, t := range types {
		out[i] = eventtypes.Spec{Name: t.Name, Ordering: int(t.Ordering), Schemas: t.Schemas}
	}
	return out
}
