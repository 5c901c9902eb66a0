package orders

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox"
)

// newOrder returns an order as an UPDATE … RETURNING row gives it; opts
// adjust it.
func newOrder(opts ...func(*Order)) Order {
	at := time.Date(2026, 5, 1, 12, 30, 0, 123456000, time.UTC)
	o := Order{
		ID: uuid.New(), Customer: "alice", Email: "alice@example.com", Currency: "EUR",
		Items:      []Line{{SKU: "SKU-1", Quantity: 2, UnitPriceCents: 1250}},
		TotalCents: 2500, Status: StatusPlaced, Version: 1, CreatedAt: at, UpdatedAt: at,
	}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// atLimits is the largest order the API accepts: every line, the longest
// SKUs (in non-ASCII characters) and the longest email address.
func atLimits(o *Order) {
	o.Email = strings.Repeat("a", 64) + "@" + strings.Repeat("b", MaxEmailLength-64-1-4) + ".com"
	o.Items = make([]Line, MaxLines)
	for i := range o.Items {
		o.Items[i] = Line{SKU: strings.Repeat("é", MaxSKULength/2), Quantity: MaxQuantity, UnitPriceCents: MaxUnitPrice}
	}
	o.TotalCents = MaxLines * MaxQuantity * MaxUnitPrice
}

func testWriter(t *testing.T) *outbox.Writer {
	t.Helper()
	types, err := EventTypes()
	require.NoError(t, err)
	w, err := outbox.NewWriter(types)
	require.NoError(t, err)
	return w
}

// TestCommandEvents (W4, W5, L2) pins what each command does from each
// status: the status it leads to and the events it emits, in version
// order. The events, built from the order as a transaction would commit
// it, pass the outbox writer's checks against the published schemas, also
// for the largest order the API accepts. Every other status is refused.
func TestCommandEvents(t *testing.T) {
	t.Parallel()
	w := testWriter(t)
	type outcome struct {
		to     Status
		events []string
	}
	decides := map[string]func(Status) (Status, []emit, error){
		"Pay":    PayOrder{}.decide,
		"Cancel": CancelOrder{}.decide,
		"Ship":   ShipOrder{}.decide,
	}
	allowed := map[string]map[Status]outcome{
		"Pay": {StatusPlaced: {StatusPaid, []string{EventPaid}}},
		"Cancel": {
			StatusPlaced: {StatusCancelled, []string{EventCancelled}},
			StatusPaid:   {StatusCancelled, []string{EventCancelled, EventRefundRequested}},
		},
		"Ship": {StatusPaid: {StatusShipped, []string{EventShipped}}},
	}

	for name, decide := range decides {
		for _, from := range []Status{StatusPlaced, StatusPaid, StatusShipped, StatusCancelled} {
			t.Run(name+"From"+strings.ToUpper(string(from[:1]))+string(from[1:]), func(t *testing.T) {
				t.Parallel()
				to, emits, err := decide(from)
				want, ok := allowed[name][from]
				if !ok {
					var te *TransitionError
					require.ErrorAs(t, err, &te)
					require.Equal(t, from, te.From)
					require.Empty(t, emits)
					return
				}
				require.NoError(t, err)
				require.Equal(t, want.to, to)
				for _, limits := range []bool{false, true} {
					// The order was at version 3 before the command.
					after := newOrder(func(o *Order) { o.Status, o.Version = to, 3+int64(len(emits)) })
					if limits {
						atLimits(&after)
					}
					events, err := toEvents(emits, after)
					require.NoError(t, err)
					var types []string
					for i, e := range events {
						types = append(types, e.Type)
						require.EqualValues(t, 4+i, e.AggregateVersion, "consecutive versions after the order's last (W4)")
						require.Equal(t, after.ID.String(), e.AggregateID)
					}
					require.Equal(t, want.events, types)
					require.NoError(t, w.Validate(events))
				}
			})
		}
	}

	t.Run("Place", func(t *testing.T) {
		t.Parallel()
		for _, o := range []Order{newOrder(), newOrder(atLimits)} {
			events, err := toEvents(PlaceOrder{}.emits(), o)
			require.NoError(t, err)
			require.Len(t, events, 1)
			require.Equal(t, EventPlaced, events[0].Type)
			require.EqualValues(t, 1, events[0].AggregateVersion)
			require.NoError(t, w.Validate(events))
		}
	})
}

// TestOutboxRefusals: the outbox's size refusal reaches the caller as
// ErrEventTooLarge (a 4xx, W6); any other refusal is a defect in the order
// events and is not mistaken for it. Either way nothing is written. The
// schema refusal needs a Writer that checks schemas on insert: the
// service's own trusts the payloads it builds, whose shape
// TestCommandEvents pins.
func TestOutboxRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t)
	types, err := EventTypes()
	require.NoError(t, err)
	checking, err := outbox.NewWriter(types, outbox.WithSchemaCheckOnInsert())
	require.NoError(t, err)
	f.svc.writer = checking
	ctx := context.Background()
	for name, tc := range map[string]struct {
		order    Order
		tooLarge bool
	}{
		"PayloadTooLarge": {newOrder(func(o *Order) { o.Email = strings.Repeat("a", outbox.MaxPayloadBytes) + "@example.com" }), true},
		"FailsItsSchema":  {newOrder(func(o *Order) { o.Customer = "" }), false},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tx, err := f.pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx) //nolint:errcheck // the test never commits
			_, err = f.svc.recordEvents(ctx, tx, placeCommand, PlaceOrder{}.emits(), tc.order)
			require.ErrorIs(t, err, outbox.ErrInvalidEvent)
			require.Equal(t, tc.tooLarge, errors.Is(err, ErrEventTooLarge))
			var n int
			require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n))
			require.Zero(t, n)
		})
	}
}
