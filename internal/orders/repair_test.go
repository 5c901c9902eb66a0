package orders

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox"
)

// TestCheckRepair: a repaired order event must name its own order, and
// carry one plain email address; the refusal names the field and never
// quotes the value.
func TestCheckRepair(t *testing.T) {
	t.Parallel()
	order := uuid.NewString()
	repaired := func(typ, payload string) outbox.Event {
		return outbox.Event{AggregateType: AggregateType, AggregateID: order, AggregateVersion: 1, Type: typ, SchemaVersion: 1,
			Payload: json.RawMessage(payload)}
	}
	placed := func(orderID, email string) outbox.Event {
		b, err := json.Marshal(map[string]any{"order_id": orderID, "customer": "alice", "email": email, "currency": "EUR",
			"items": []any{map[string]any{"sku": "A", "quantity": 1, "unit_price_cents": 1}}, "total_cents": 1, "placed_at": "2026-01-01T00:00:00Z"})
		require.NoError(t, err)
		return repaired(EventPlaced, string(b))
	}

	require.NoError(t, CheckRepair(placed(order, "alice@example.com")))
	require.NoError(t, CheckRepair(repaired(EventRefundRequested,
		fmt.Sprintf(`{"order_id": %q, "currency": "EUR", "amount_cents": 1, "requested_at": "2026-01-01T00:00:00Z"}`, order))),
		"a type without an email")

	for name, tc := range map[string]struct {
		event outbox.Event
		want  string
	}{
		"AnotherOrder":   {placed(uuid.NewString(), "alice@example.com"), "order_id must be the event's own order, " + order},
		"NoOrderID":      {repaired(EventShipped, `{"email": "alice@example.com", "shipped_at": "2026-01-01T00:00:00Z"}`), "order_id"},
		"EmailCRLF":      {placed(order, "alice@example.com\r\nBcc: eve@example.com"), "payload email must be one plain address"},
		"EmailLF":        {placed(order, "alice@example.com\n"), "payload email must be one plain address"},
		"EmailName":      {placed(order, "Alice <alice@example.com>"), "payload email must be one plain address"},
		"EmailList":      {placed(order, "alice@example.com, eve@example.com"), "payload email must be one plain address"},
		"EmailNotEmail":  {placed(order, "alice"), "payload email must be one plain address"},
		"NotAnObject":    {repaired(EventPlaced, `[1]`), "payload is not a JSON object"},
		"OtherAggregate": {outbox.Event{AggregateType: "invoice", AggregateID: order, Payload: json.RawMessage(`{}`)}, `aggregate type "invoice"`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := CheckRepair(tc.event)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "eve@", "the value is not quoted")
			require.NotContains(t, err.Error(), "alice@example.com\r", "the value is not quoted")
		})
	}
}
