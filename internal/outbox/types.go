package outbox

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

// EventType describes one event type to the relay.
type EventType struct {
	// Name is the event type, e.g. "order.placed" (the CloudEvents type).
	Name string
	// Ordering is the delivery policy within an aggregate.
	Ordering Ordering
	// Schemas maps each schema version to its JSON Schema document. The
	// relay validates payloads against it before sending (R5); an event
	// whose type or schema version is missing here is parked.
	Schemas map[int][]byte
}
