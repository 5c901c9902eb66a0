package orders

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/outboxref/orders/internal/outbox"
)

// CheckRepair is the order events' check of an event an operator repaired
// (operate.WithRepairCheck), beyond its JSON Schema, which the outbox has
// already checked: the payload's order_id is the event's own order, and
// its email, where the type has one, is one plain address, as when the
// order was placed. A payload naming another order would be delivered as
// that order's event, to its consumers and its customer; an address with
// a line break, a display name or a list would put other recipients or
// headers in the notifier's email. The errors name the field, never the
// value: they are shown to the operator and logged.
func CheckRepair(e outbox.Event) error {
	if e.AggregateType != AggregateType {
		return fmt.Errorf("aggregate type %q is not %q", e.AggregateType, AggregateType)
	}
	var p struct {
		OrderID *string `json:"order_id"`
		Email   *string `json:"email"`
	}
	if err := json.Unmarshal(e.Payload, &p); err != nil {
		return errors.New("payload is not a JSON object with string order_id and email")
	}
	if p.OrderID == nil || *p.OrderID != e.AggregateID {
		return fmt.Errorf("payload order_id must be the event's own order, %s", e.AggregateID)
	}
	if p.Email != nil && !plainAddress(*p.Email) {
		return errors.New("payload email must be one plain address such as alice@example.com (no display name, list or line break)")
	}
	return nil
}
