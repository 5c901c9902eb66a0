package orders

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/pgtest"
	"github.com/outboxref/orders/internal/testlog"
)

var (
	alice = auth.Principal{Subject: "alice", Role: auth.RoleCustomer}
	bob   = auth.Principal{Subject: "bob", Role: auth.RoleCustomer}
	ops   = auth.Principal{Subject: "ops", Role: auth.RoleAdmin}
)

type fixture struct {
	svc  *Service
	pool *pgxpool.Pool
	logs *testlog.Buffer
}

func setup(t testing.TB) *fixture {
	t.Helper()
	db := pgtest.New(t, schema.Orders()...)
	logs := &testlog.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	svc, err := NewService(db.Pool, WithLogger(log))
	require.NoError(t, err)
	return &fixture{svc: svc, pool: db.Pool, logs: logs}
}

// newInput returns a valid order request; opts adjust it.
func newInput(opts ...func(*CreateInput)) CreateInput {
	q, p := int64(2), int64(1250)
	in := CreateInput{Email: "alice@example.com", Currency: "EUR", Items: []LineInput{{SKU: "SKU-1", Quantity: &q, UnitPriceCents: &p}}}
	for _, o := range opts {
		o(&in)
	}
	return in
}

type outboxRow struct {
	EventID          uuid.UUID
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	EventType        string
	SchemaVersion    int
	Payload          json.RawMessage
	State            string
	Xmin             string
}

func (f *fixture) outbox(t *testing.T, aggregateID string) []outboxRow {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `
		SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload, state, xmin::text
		FROM outbox WHERE aggregate_id = $1 OR $1 = '' ORDER BY aggregate_id, aggregate_version`, aggregateID)
	require.NoError(t, err)
	defer rows.Close()
	var out []outboxRow
	for rows.Next() {
		var r outboxRow
		require.NoError(t, rows.Scan(&r.EventID, &r.AggregateType, &r.AggregateID, &r.AggregateVersion, &r.EventType, &r.SchemaVersion, &r.Payload, &r.State, &r.Xmin))
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

func (f *fixture) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

func (f *fixture) orderXmin(t *testing.T, id uuid.UUID) string {
	t.Helper()
	var x string
	require.NoError(t, f.pool.QueryRow(context.Background(), "SELECT xmin::text FROM orders WHERE id = $1", id).Scan(&x))
	return x
}

// requireNothingWritten fails unless the database holds no order, line
// or outbox row: a failed create rolled back whole.
func (f *fixture) requireNothingWritten(t *testing.T) {
	t.Helper()
	require.Zero(t, f.count(t, "orders"), "the order row must roll back with the failed outbox write")
	require.Zero(t, f.count(t, "order_lines"))
	require.Zero(t, f.count(t, "outbox"))
}

var errInjected = errors.New("injected failure after the business write")

// TestAtomicity shows V1: the order and its outbox rows commit or roll back
// together, also when a failure strikes after the business write.
func TestAtomicity(t *testing.T) {
	t.Parallel()

	t.Run("CreateFailsInItsLastStatement", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		ctx := context.Background()
		// The create's statements go in one round trip with no COMMIT of
		// their own; a trigger fails the last, the outbox insert, after the
		// order and its lines are written.
		_, err := f.pool.Exec(ctx, `CREATE FUNCTION fail_insert() RETURNS trigger LANGUAGE plpgsql
				AS $$ BEGIN RAISE EXCEPTION 'injected failure of the outbox insert'; END $$;
			CREATE TRIGGER fail_outbox BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION fail_insert()`)
		require.NoError(t, err)
		_, _, err = f.svc.Place(ctx, alice, PlaceOrder{Input: newInput()})
		require.ErrorContains(t, err, "injected failure")
		require.NotErrorIs(t, err, ErrCommitUnknown, "the database refused the batch: nothing committed, and the caller is told so")
		f.requireNothingWritten(t)
	})

	t.Run("CreateInDirectModeFailsAfterBusinessWrite", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		ctx := context.Background()
		// A type in direct publish mode takes the explicit transaction
		// (O7), where a failure can strike between the writes and COMMIT.
		_, err := f.pool.Exec(ctx, "INSERT INTO outbox_publish_mode (event_type, mode, changed_by) VALUES ($1, 'direct', 'test')", EventPlaced)
		require.NoError(t, err)
		called := false
		f.svc.afterWrite = func(context.Context, pgx.Tx, string) error { called = true; return errInjected }
		_, _, err = f.svc.Place(ctx, alice, PlaceOrder{Input: newInput()})
		require.ErrorIs(t, err, errInjected)
		require.True(t, called, "the create ran in an explicit transaction")
		f.requireNothingWritten(t)
	})

	t.Run("PayFailsAfterBusinessWrite", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		o, _, err := f.svc.Place(context.Background(), alice, PlaceOrder{Input: newInput()})
		require.NoError(t, err)
		f.svc.afterWrite = func(context.Context, pgx.Tx, string) error { return errInjected }
		_, err = f.svc.Pay(context.Background(), alice, PayOrder{ID: o.ID, ExpectedVersion: 1})
		require.ErrorIs(t, err, errInjected)
		got, err := f.svc.Get(context.Background(), alice, o.ID)
		require.NoError(t, err)
		require.Equal(t, StatusPlaced, got.Status)
		require.EqualValues(t, 1, got.Version)
		rows := f.outbox(t, o.ID.String())
		require.Len(t, rows, 1)
		require.Equal(t, EventPlaced, rows[0].EventType)
	})

	t.Run("OutboxConstraintViolationRollsBackOrder", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		o, _, err := f.svc.Place(context.Background(), alice, PlaceOrder{Input: newInput()})
		require.NoError(t, err)
		// Another writer already holds version 2 of this aggregate: the
		// unique constraint fails the outbox insert, after the update.
		_, err = f.pool.Exec(context.Background(), `INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
			VALUES ($1, 'order', $2, 2, 'order.paid', 1, '{}')`, uuid.New(), o.ID.String())
		require.NoError(t, err)
		_, err = f.svc.Pay(context.Background(), alice, PayOrder{ID: o.ID, ExpectedVersion: 1})
		require.Error(t, err)
		got, err := f.svc.Get(context.Background(), alice, o.ID)
		require.NoError(t, err)
		require.Equal(t, StatusPlaced, got.Status, "the status update must roll back with the outbox insert")
		require.EqualValues(t, 1, got.Version)
	})

	t.Run("CommittedTogether", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		o, _, err := f.svc.Place(context.Background(), alice, PlaceOrder{Input: newInput()})
		require.NoError(t, err)
		rows := f.outbox(t, o.ID.String())
		require.Len(t, rows, 1)
		require.Equal(t, f.orderXmin(t, o.ID), rows[0].Xmin, "order and event must be written by the same transaction")
	})
}

// TestConnectionLostBeforeCommit: a command whose database session dies
// before COMMIT (here terminated by the server, as a failover or an
// operator would) fails with ErrUnavailable, which the API answers 503
// with Retry-After, not with the commit-unknown problem: nothing was
// committed and the client may simply retry. The retry then succeeds.
func TestConnectionLostBeforeCommit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	o, _, err := f.svc.Place(ctx, alice, PlaceOrder{Input: newInput()})
	require.NoError(t, err)
	f.svc.afterWrite = func(ctx context.Context, tx pgx.Tx, _ string) error {
		_, err := f.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", tx.Conn().PgConn().PID())
		return err
	}
	_, err = f.svc.Pay(ctx, alice, PayOrder{ID: o.ID, ExpectedVersion: 1})
	require.ErrorIs(t, err, ErrUnavailable)
	require.NotErrorIs(t, err, ErrCommitUnknown)
	got, err := f.svc.Get(ctx, alice, o.ID)
	require.NoError(t, err)
	require.Equal(t, StatusPlaced, got.Status, "nothing of the failed command was committed")
	require.Len(t, f.outbox(t, o.ID.String()), 1)

	f.svc.afterWrite = nil
	paid, err := f.svc.Pay(ctx, alice, PayOrder{ID: o.ID, ExpectedVersion: 1})
	require.NoError(t, err, "the same request retried")
	require.Equal(t, StatusPaid, paid.Status)
	require.Len(t, f.outbox(t, o.ID.String()), 2)
	require.Contains(t, f.logs.String(), "failed before commit")
}

// TestFailureLogNamesCommandAndNeverClaimsDelivery covers W7.
func TestFailureLogNamesCommandAndNeverClaimsDelivery(t *testing.T) {
	t.Parallel()
	f := setup(t)
	o, _, err := f.svc.Place(context.Background(), alice, PlaceOrder{Input: newInput()})
	require.NoError(t, err)
	f.svc.afterWrite = func(context.Context, pgx.Tx, string) error { return errInjected }
	_, err = f.svc.Pay(context.Background(), alice, PayOrder{ID: o.ID, ExpectedVersion: 1})
	require.ErrorIs(t, err, errInjected)

	var line map[string]any
	for _, l := range strings.Split(strings.TrimSpace(f.logs.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m))
		if m["level"] == "ERROR" {
			line = m
		}
	}
	require.NotNil(t, line, "a failed transaction must be logged at error level")
	require.Equal(t, payCommand, line["command"])
	require.Equal(t, o.ID.String(), line["aggregate_id"])
	require.Equal(t, AggregateType, line["aggregate_type"])
	msg := strings.ToLower(line["msg"].(string))
	for _, claim := range []string{"sent", "publish", "delivered", "recorded in outbox"} {
		require.NotContains(t, msg, claim, "a failed transaction's log must not claim %q", claim)
	}
	require.Contains(t, msg, "no event recorded")
}

// TestEventPayloads checks W4 and W5: payloads equal the committed row,
// validate against their published JSON Schema, and a paid order's
// cancellation emits two consecutive versions in one transaction. The
// trace context of the command's context is stored with its events (L4).
func TestEventPayloads(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	q3, p3 := int64(1), int64(999)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	o, _, err := f.svc.Place(withTraceparent(t, ctx, tp), alice, PlaceOrder{Input: newInput(func(in *CreateInput) {
		in.Items = append(in.Items, LineInput{SKU: "SKU-2", Quantity: &q3, UnitPriceCents: &p3})
	})})
	require.NoError(t, err)
	require.EqualValues(t, 2*1250+999, o.TotalCents)
	paid, err := f.svc.Pay(ctx, alice, PayOrder{ID: o.ID, ExpectedVersion: 1})
	require.NoError(t, err)
	cancelled, err := f.svc.Cancel(ctx, alice, CancelOrder{ID: o.ID, ExpectedVersion: 2})
	require.NoError(t, err)
	require.EqualValues(t, 4, cancelled.Version)
	require.Equal(t, StatusCancelled, cancelled.Status)

	rows := f.outbox(t, o.ID.String())
	require.Len(t, rows, 4)
	wantTypes := []string{EventPlaced, EventPaid, EventCancelled, EventRefundRequested}
	seen := map[uuid.UUID]bool{}
	types, err := EventTypes()
	require.NoError(t, err)
	compiled := compileSchemas(t, types)
	for i, r := range rows {
		require.Equal(t, wantTypes[i], r.EventType)
		require.EqualValues(t, i+1, r.AggregateVersion, "versions are consecutive per aggregate")
		require.Equal(t, AggregateType, r.AggregateType)
		require.Equal(t, 1, r.SchemaVersion)
		require.Equal(t, "pending", r.State)
		require.False(t, seen[r.EventID], "event ids are unique")
		seen[r.EventID] = true
		var doc any
		require.NoError(t, json.Unmarshal(r.Payload, &doc))
		require.NoError(t, compiled[r.EventType].Validate(doc), "%s payload must match its schema", r.EventType)
	}
	require.Equal(t, rows[2].Xmin, rows[3].Xmin, "cancelled and refund_requested come from one transaction")
	require.Equal(t, f.orderXmin(t, o.ID), rows[3].Xmin, "and that transaction also wrote the order")
	require.NotEqual(t, rows[1].Xmin, rows[2].Xmin)

	var placed placedV1
	require.NoError(t, json.Unmarshal(rows[0].Payload, &placed))
	require.Equal(t, placedV1{OrderID: o.ID.String(), Customer: "alice", Email: o.Email, Currency: o.Currency,
		Items: o.Items, TotalCents: o.TotalCents, PlacedAt: o.CreatedAt}, normalise(placed))
	var pd paidV1
	require.NoError(t, json.Unmarshal(rows[1].Payload, &pd))
	require.Equal(t, paidV1{OrderID: o.ID.String(), Email: o.Email, Currency: o.Currency, TotalCents: o.TotalCents, PaidAt: paid.UpdatedAt}, pd)
	var cn cancelledV1
	require.NoError(t, json.Unmarshal(rows[2].Payload, &cn))
	require.Equal(t, cancelledV1{OrderID: o.ID.String(), Email: o.Email, PreviousStatus: StatusPaid, CancelledAt: cancelled.UpdatedAt}, cn)
	var rr refundRequestedV1
	require.NoError(t, json.Unmarshal(rows[3].Payload, &rr))
	require.Equal(t, refundRequestedV1{OrderID: o.ID.String(), Currency: o.Currency, AmountCents: o.TotalCents, RequestedAt: cancelled.UpdatedAt}, rr)
	for _, forbidden := range []string{"version", "status", "lease", "password", "token"} {
		require.NotContains(t, string(rows[0].Payload), `"`+forbidden+`"`, "payloads carry the contract, not the row")
	}

	// Event ids are stable: later commands do not rewrite earlier rows.
	_, err = f.pool.Exec(ctx, "UPDATE orders SET email = 'changed@example.com' WHERE id = $1", o.ID)
	require.NoError(t, err)
	again := f.outbox(t, o.ID.String())
	for i := range rows {
		require.Equal(t, rows[i].EventID, again[i].EventID)
		require.JSONEq(t, string(rows[i].Payload), string(again[i].Payload), "payloads are never re-read after commit")
	}
	var stored *string
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT traceparent FROM outbox WHERE event_id = $1", rows[0].EventID).Scan(&stored))
	require.NotNil(t, stored)
	require.Equal(t, tp, *stored, "the span context of the command's context")
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT traceparent FROM outbox WHERE event_id = $1", rows[1].EventID).Scan(&stored))
	require.Nil(t, stored, "no traceparent when the command's context carried no span")
}

// withTraceparent returns ctx carrying the span context of a W3C
// traceparent, as the API's server span would.
func withTraceparent(t *testing.T, ctx context.Context, traceparent string) context.Context {
	t.Helper()
	ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
	require.True(t, trace.SpanContextFromContext(ctx).IsValid())
	return ctx
}

func normalise(p placedV1) placedV1 {
	p.PlacedAt = p.PlacedAt.UTC()
	return p
}

func compileSchemas(t *testing.T, types []outbox.EventType) map[string]*jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	out := map[string]*jsonschema.Schema{}
	for _, et := range types {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(et.Schemas[1]))
		require.NoError(t, err)
		url := fmt.Sprintf("mem:///%s.json", et.Name)
		require.NoError(t, c.AddResource(url, doc))
		s, err := c.Compile(url)
		require.NoError(t, err)
		out[et.Name] = s
	}
	return out
}

func TestTransitionsAndPermissions(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	o, _, err := f.svc.Place(ctx, alice, PlaceOrder{Input: newInput()})
	require.NoError(t, err)

	_, err = f.svc.Get(ctx, bob, o.ID)
	require.ErrorIs(t, err, ErrNotFound, "another customer's order is invisible")
	_, err = f.svc.Pay(ctx, bob, PayOrder{ID: o.ID, ExpectedVersion: 1})
	require.ErrorIs(t, err, ErrNotFound)
	_, err = f.svc.Ship(ctx, alice, ShipOrder{ID: o.ID, ExpectedVersion: 1})
	require.ErrorIs(t, err, ErrForbidden, "only admins ship")
	_, err = f.svc.Ship(ctx, ops, ShipOrder{ID: o.ID, ExpectedVersion: 1})
	var te *TransitionError
	require.ErrorAs(t, err, &te, "a placed order cannot ship")
	_, err = f.svc.Pay(ctx, alice, PayOrder{ID: o.ID, ExpectedVersion: 7})
	var vc *VersionConflictError
	require.ErrorAs(t, err, &vc)
	require.EqualValues(t, 1, vc.Current)

	_, err = f.svc.Pay(ctx, alice, PayOrder{ID: o.ID, ExpectedVersion: 1})
	require.NoError(t, err)
	shipped, err := f.svc.Ship(ctx, ops, ShipOrder{ID: o.ID, ExpectedVersion: 2})
	require.NoError(t, err)
	require.Equal(t, StatusShipped, shipped.Status)
	_, err = f.svc.Cancel(ctx, alice, CancelOrder{ID: o.ID, ExpectedVersion: 3})
	require.ErrorAs(t, err, &te, "a shipped order cannot be cancelled")
	require.Len(t, f.outbox(t, o.ID.String()), 3)
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()

	first, replayed, err := f.svc.Place(ctx, alice, PlaceOrder{Input: newInput(), IdempotencyKey: "key-1"})
	require.NoError(t, err)
	require.False(t, replayed)
	again, replayed, err := f.svc.Place(ctx, alice, PlaceOrder{Input: newInput(), IdempotencyKey: "key-1"})
	require.NoError(t, err)
	require.True(t, replayed)
	require.Equal(t, first.ID, again.ID)

	_, _, err = f.svc.Place(ctx, alice, PlaceOrder{Input: newInput(func(in *CreateInput) { in.Currency = "USD" }), IdempotencyKey: "key-1"})
	require.ErrorIs(t, err, ErrIdempotencyKeyReused)

	// Keys are scoped to the customer: Bob's key-1 is a different key.
	bobs, replayed, err := f.svc.Place(ctx, bob, PlaceOrder{Input: newInput(), IdempotencyKey: "key-1"})
	require.NoError(t, err)
	require.False(t, replayed)
	require.NotEqual(t, first.ID, bobs.ID)

	// Concurrent retries of one request create one order.
	var wg sync.WaitGroup
	ids := make([]uuid.UUID, 10)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, _, err := f.svc.Place(ctx, alice, PlaceOrder{Input: newInput(), IdempotencyKey: "key-race"})
			if err == nil {
				ids[i] = o.ID
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		require.Equal(t, ids[0], id)
	}
	require.Equal(t, 3, f.count(t, "orders"))
	require.Equal(t, 3, f.count(t, "outbox"))
}

func TestListRejectsBadLimits(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, _, err := f.svc.Place(context.Background(), alice, PlaceOrder{Input: newInput()})
	require.NoError(t, err)
	for _, limit := range []int{0, -1, MaxPageSize + 1} {
		_, _, err := f.svc.List(context.Background(), alice, nil, limit)
		var ve *ValidationError
		require.ErrorAs(t, err, &ve, "limit %d", limit)
	}
	got, next, err := f.svc.List(context.Background(), alice, nil, 1)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Nil(t, next)
}
