package orders

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"

	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/orders/ordersdb"
	"github.com/outboxref/orders/internal/outbox"
)

// Service runs order commands and queries.
type Service struct {
	pool   *pgxpool.Pool
	writer *outbox.Writer // checks every event against EventTypes() before writing it (its payload's schema: see NewService)
	log    *slog.Logger
	now    func() time.Time
	nudge  func()
	// afterWrite runs inside the transaction after the business write and
	// before the outbox insert. Tests use it to inject a failure there
	// (V1). Place runs it only in its explicit transaction, taken for event
	// types in direct or shadow publish mode, after its batch and before
	// the direct send; its one-round-trip batch leaves no moment between
	// the writes and the commit.
	afterWrite func(ctx context.Context, tx pgx.Tx, command string) error
}

// Option configures a Service.
type Option func(*Service)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Service) { s.log = l } }

// WithNudge sets a function called after every commit that recorded events,
// to wake the in-process relay (R8). It must not block.
func WithNudge(f func()) Option { return func(s *Service) { s.nudge = f } }

// WithWriter makes the service write its events with w instead of a
// Writer of its own, so that a process builds one Writer and shares it (its
// outbox operations check repairs with the same one). w must have been
// built from EventTypes(). A deployment migrating to the outbox gives w
// the publish-inside-the-transaction path (outbox.WithDirectPublisher)
// that event types switched to direct or shadow publish mode use (O7);
// without it, commands emitting such types fail with
// outbox.ErrNoDirectPublisher, as they do with the service's own Writer.
func WithWriter(w *outbox.Writer) Option { return func(s *Service) { s.writer = w } }

// WithClock sets the time source (default time.Now).
func WithClock(now func() time.Time) Option { return func(s *Service) { s.now = now } }

// NewService returns a service over pool. Its outbox writer, unless
// WithWriter gives one, is built from EventTypes(), the schemas published
// in docs/schemas. It checks each event's type, version, size and JSON
// before writing it, but not the payload's shape against its schema: the
// payloads are encoded from typed structs (events.go), and
// TestCommandEvents validates every one a command can build against the
// published schemas, so a shape that breaks its contract fails the tests
// rather than a create (docs/architecture.md).
func NewService(pool *pgxpool.Pool, opts ...Option) (*Service, error) {
	s := &Service{pool: pool, log: slog.Default(), now: time.Now, nudge: func() {}}
	for _, o := range opts {
		o(s)
	}
	if s.writer == nil {
		types, err := EventTypes()
		if err != nil {
			return nil, fmt.Errorf("order event types: %w", err)
		}
		if s.writer, err = outbox.NewWriter(types); err != nil {
			return nil, fmt.Errorf("order events: %w", err)
		}
	}
	return s, nil
}

// Place runs PlaceOrder: it creates an order for the caller. With an
// IdempotencyKey, a retry of the same request returns the order created
// first (replayed=true) instead of creating another one (S3).
func (s *Service) Place(ctx context.Context, p auth.Principal, cmd PlaceOrder) (o Order, replayed bool, err error) {
	if p.Role == auth.RoleService {
		return Order{}, false, ErrForbidden
	}
	in, key := cmd.Input, cmd.IdempotencyKey
	if err := in.Validate(); err != nil {
		return Order{}, false, err
	}
	fp := in.fingerprint()
	if key != "" {
		if o, found, err := s.replay(ctx, p, key, fp); found || err != nil {
			return o, found, err
		}
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Order{}, false, fmt.Errorf("generate order id: %w", err)
	}
	// The order as this transaction writes it: every value is known before
	// the statements run (the time is cut to PostgreSQL's microseconds), so
	// its events can be built first and everything sent in one round trip.
	now := s.now().UTC().Truncate(time.Microsecond)
	o = Order{ID: id, Customer: p.Subject, Email: in.Email, Currency: in.Currency, Status: StatusPlaced,
		Version: 1, CreatedAt: now, UpdatedAt: now, Items: make([]Line, len(in.Items))}
	lp := ordersdb.OrderLinesInsertParams{OrderID: id}
	for i, l := range in.Items {
		o.TotalCents += *l.Quantity * *l.UnitPriceCents
		o.Items[i] = Line{SKU: l.SKU, Quantity: int32(*l.Quantity), UnitPriceCents: *l.UnitPriceCents} // bounded by Validate
		lp.LineNos = append(lp.LineNos, int32(i+1))
		lp.SKUs = append(lp.SKUs, l.SKU)
		lp.Quantities = append(lp.Quantities, int32(*l.Quantity))
		lp.UnitPricesCents = append(lp.UnitPricesCents, *l.UnitPriceCents)
	}
	events, err := toEvents(cmd.emits(), o)
	if err != nil {
		s.logFailure(ctx, placeCommand, id, err)
		return Order{}, false, err
	}
	// The order's rows, its events and the idempotency key, as one batch.
	// queue adds the events' insert: QueueOneTrip or Queue.
	var row ordersdb.Order
	var lines []ordersdb.OrderLine
	batch := func(queue func(*pgx.Batch) error) (*pgx.Batch, error) {
		b := &pgx.Batch{}
		ordersdb.QueueOrderInsert(b, ordersdb.OrderInsertParams{
			ID: id, Customer: p.Subject, Email: in.Email, Currency: in.Currency, TotalCents: o.TotalCents, Now: now,
		}, &row)
		ordersdb.QueueOrderLinesInsert(b, lp, &lines)
		if err := queue(b); err != nil {
			return nil, eventsRefused(placeCommand, err)
		}
		if key != "" {
			ordersdb.QueueIdempotencyKeyInsert(b, ordersdb.IdempotencyKeyInsertParams{
				Customer: p.Subject, Key: key, RequestHash: fp, OrderID: id,
			})
		}
		return b, nil
	}
	// One round trip: the batch sent outside any explicit transaction runs
	// as one implicit transaction, committed when it ends (oneTrip). An
	// event type in direct or shadow publish mode (O7) needs a transaction
	// held open for its direct send; the events' insert then refuses the
	// batch, nothing commits, and the create runs again in an explicit one.
	b, err := batch(func(b *pgx.Batch) error { return s.writer.QueueOneTrip(ctx, b, events) })
	if err == nil {
		err = s.oneTrip(ctx, b)
	}
	if outbox.NeedsTransaction(err) {
		row, lines = ordersdb.Order{}, nil
		err = s.inTx(ctx, func(tx pgx.Tx, _ *ordersdb.Queries) error {
			// BEGIN, the batch and COMMIT, with the direct send between the
			// batch and COMMIT.
			var inserted func(context.Context, pgx.Tx) error
			b, err := batch(func(b *pgx.Batch) (err error) {
				inserted, err = s.writer.Queue(ctx, b, events)
				return err
			})
			if err != nil {
				return err
			}
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return fmt.Errorf("insert order, lines and events: %w", err)
			}
			if s.afterWrite != nil {
				if err := s.afterWrite(ctx, tx, placeCommand); err != nil {
					return err
				}
			}
			return inserted(ctx, tx)
		})
	}
	if err == nil {
		// The events were built from o; a payload must hold only what
		// committed (W5). The statements store exactly o's values, which
		// TestEventPayloads pins; a difference here means the schema
		// changed what it stores (a default, a trigger) and the payloads
		// need to follow.
		if stored := toOrder(row, lines); !reflect.DeepEqual(stored, o) {
			s.log.ErrorContext(ctx, "the stored order differs from the one its events were built from",
				"aggregate_id", id, "stored", fmt.Sprintf("%+v", stored), "built", fmt.Sprintf("%+v", o))
			o = stored
		}
	}
	if key != "" && isUniqueViolation(err, "idempotency_keys_pkey") {
		// A concurrent request with the same key committed first; this
		// transaction rolled back whole, so answer as a retry would.
		o, found, rerr := s.replay(ctx, p, key, fp)
		if rerr != nil || found {
			return o, found, rerr
		}
	}
	if err != nil {
		s.logFailure(ctx, placeCommand, id, err)
		return Order{}, false, err
	}
	s.committed(ctx, placeCommand, events)
	return o, false, nil
}

// replay answers a create carrying an Idempotency-Key that was seen before.
func (s *Service) replay(ctx context.Context, p auth.Principal, key string, fp []byte) (Order, bool, error) {
	q := ordersdb.New(s.pool)
	k, err := q.IdempotencyKeyGet(ctx, ordersdb.IdempotencyKeyGetParams{Customer: p.Subject, Key: key})
	if errors.Is(err, pgx.ErrNoRows) {
		return Order{}, false, nil
	}
	if err != nil {
		return Order{}, false, markUnavailable(ctx, fmt.Errorf("look up idempotency key: %w", err))
	}
	if string(k.RequestHash) != string(fp) {
		return Order{}, true, ErrIdempotencyKeyReused
	}
	o, err := s.load(ctx, q, k.OrderID)
	return o, true, markUnavailable(ctx, err)
}

// Get returns one order if the caller may see it. Customers see only their
// own orders; anyone else's is ErrNotFound, so ids cannot be probed.
func (s *Service) Get(ctx context.Context, p auth.Principal, id uuid.UUID) (Order, error) {
	o, err := s.load(ctx, ordersdb.New(s.pool), id)
	if err != nil {
		return Order{}, markUnavailable(ctx, err)
	}
	if !canSee(p, o.Customer) {
		return Order{}, ErrNotFound
	}
	return o, nil
}

// History is which event owns each version of an order, as the outbox
// wrote them. A consumer asks for it to tell the order service's genuine
// events from records that only claim a version (C7).
type History struct {
	OrderID uuid.UUID
	// Version is the order's version when the history was read; Events
	// may already hold a later one written since.
	Version int64
	Events  []outbox.EventRef
}

// History returns the order's event history, to the same callers Get
// serves. The order is read first, so every version up to Version is in
// Events.
func (s *Service) History(ctx context.Context, p auth.Principal, id uuid.UUID) (History, error) {
	o, err := s.Get(ctx, p, id)
	if err != nil {
		return History{}, err
	}
	refs, err := outbox.EventsOf(ctx, s.pool, AggregateType, id.String())
	if err != nil {
		return History{}, markUnavailable(ctx, err)
	}
	return History{OrderID: id, Version: o.Version, Events: refs}, nil
}

// Cursor is a position in the caller's order list.
type Cursor struct {
	CreatedAt time.Time `json:"t"`
	ID        uuid.UUID `json:"id"`
}

// List returns up to limit of the caller's orders, newest first, after
// the cursor (nil for the first page), and the cursor of the next page
// (nil on the last page).
func (s *Service) List(ctx context.Context, p auth.Principal, after *Cursor, limit int) ([]Order, *Cursor, error) {
	if limit < 1 || limit > MaxPageSize {
		return nil, nil, &ValidationError{Fields: []FieldError{{Field: "limit", Message: fmt.Sprintf("must be from 1 to %d", MaxPageSize)}}}
	}
	q := ordersdb.New(s.pool)
	arg := ordersdb.OrderListByCustomerParams{Customer: p.Subject, RowLimit: int32(limit + 1)}
	if after != nil {
		arg.AfterCreatedAt, arg.AfterID = &after.CreatedAt, &after.ID
	}
	rows, err := q.OrderListByCustomer(ctx, arg)
	if err != nil {
		return nil, nil, markUnavailable(ctx, fmt.Errorf("list orders: %w", err))
	}
	var next *Cursor
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[limit-1]
		next = &Cursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	ids := make([]uuid.UUID, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	lines, err := q.OrderLinesListByOrders(ctx, ids)
	if err != nil {
		return nil, nil, markUnavailable(ctx, fmt.Errorf("list order lines: %w", err))
	}
	byOrder := map[uuid.UUID][]ordersdb.OrderLine{}
	for _, l := range lines {
		byOrder[l.OrderID] = append(byOrder[l.OrderID], l)
	}
	out := make([]Order, len(rows))
	for i, r := range rows {
		out[i] = toOrder(r, byOrder[r.ID])
	}
	return out, next, nil
}

// Pay runs PayOrder: a placed order becomes paid.
func (s *Service) Pay(ctx context.Context, p auth.Principal, cmd PayOrder) (Order, error) {
	return s.change(ctx, p, command{name: payCommand, id: cmd.ID, expected: cmd.ExpectedVersion,
		decide: cmd.decide})
}

// Cancel runs CancelOrder: a placed or paid order becomes cancelled, and a
// paid one also requests its refund, in the same transaction (W4).
func (s *Service) Cancel(ctx context.Context, p auth.Principal, cmd CancelOrder) (Order, error) {
	return s.change(ctx, p, command{name: cancelCommand, id: cmd.ID, expected: cmd.ExpectedVersion,
		decide: cmd.decide})
}

// Ship runs ShipOrder: a paid order becomes shipped. Admins only.
func (s *Service) Ship(ctx context.Context, p auth.Principal, cmd ShipOrder) (Order, error) {
	return s.change(ctx, p, command{name: shipCommand, id: cmd.ID, expected: cmd.ExpectedVersion,
		adminOnly: true, decide: cmd.decide})
}

// command is what every command on an existing order has in common, taken
// from its typed command by the Service method that runs it.
type command struct {
	name      string // in logs (W7)
	id        uuid.UUID
	expected  int64 // If-Match
	adminOnly bool
	// decide is the command's rule: from the current status, the next one
	// and the events, in version order.
	decide func(from Status) (Status, []emit, error)
}

// change runs a command on an existing order: check, conditional update,
// outbox insert, all in one transaction.
func (s *Service) change(ctx context.Context, p auth.Principal, c command) (o Order, err error) {
	var events []outbox.Event
	err = s.inTx(ctx, func(tx pgx.Tx, q *ordersdb.Queries) error {
		cur, err := q.OrderGet(ctx, c.id)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && !canSee(p, cur.Customer)) {
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("read order: %w", err)
		}
		if p.Role == auth.RoleService || (c.adminOnly && p.Role != auth.RoleAdmin) {
			return ErrForbidden
		}
		if cur.Version != c.expected {
			return &VersionConflictError{Expected: c.expected, Current: cur.Version}
		}
		next, emits, err := c.decide(Status(cur.Status))
		if err != nil {
			return err
		}
		row, err := q.OrderUpdateStatus(ctx, ordersdb.OrderUpdateStatusParams{
			ID: c.id, ExpectedVersion: c.expected, Status: string(next),
			// One version per event (W4).
			NewVersion: c.expected + int64(len(emits)), Now: s.now(),
		})
		if errors.Is(err, pgx.ErrNoRows) {
			// Another command changed the order between our read and our
			// update; the version condition refused to overwrite it.
			current := c.expected
			if latest, gerr := q.OrderGet(ctx, c.id); gerr == nil {
				current = latest.Version
			}
			return &VersionConflictError{Expected: c.expected, Current: current}
		}
		if err != nil {
			return fmt.Errorf("update order: %w", err)
		}
		lines, err := q.OrderLinesList(ctx, c.id)
		if err != nil {
			return fmt.Errorf("read order lines: %w", err)
		}
		o = toOrder(row, lines)
		events, err = s.recordEvents(ctx, tx, c.name, emits, o)
		return err
	})
	if err != nil {
		s.logFailure(ctx, c.name, c.id, err)
		return Order{}, err
	}
	s.committed(ctx, c.name, events)
	return o, nil
}

// recordEvents writes a command's events into the outbox inside tx, built
// from after, the order as tx is committing it (W5). The writer stores the
// trace context of the span in ctx with each event (L4).
func (s *Service) recordEvents(ctx context.Context, tx pgx.Tx, command string, emits []emit, after Order) ([]outbox.Event, error) {
	if s.afterWrite != nil {
		if err := s.afterWrite(ctx, tx, command); err != nil {
			return nil, err
		}
	}
	events, err := toEvents(emits, after)
	if err != nil {
		return nil, err
	}
	if err := s.writer.Insert(ctx, tx, events); err != nil {
		return nil, eventsRefused(command, err)
	}
	return events, nil
}

// eventsRefused names the outbox's refusal of a command's events.
func eventsRefused(command string, err error) error {
	if errors.Is(err, outbox.ErrPayloadTooLarge) {
		return fmt.Errorf("%w: %w", ErrEventTooLarge, err)
	}
	// Any other refusal is a defect in the order events, not in the
	// request: it answers 500, and nothing was written.
	return fmt.Errorf("record %s events: %w", command, err)
}

// committed runs after a successful commit: the events are durable in the
// outbox now, though not yet delivered. The nudge only shortens latency; a
// lost nudge is covered by the relay's polling.
func (s *Service) committed(ctx context.Context, command string, events []outbox.Event) {
	for _, e := range events {
		s.log.InfoContext(ctx, "order command committed; event recorded in outbox",
			"command", command, "aggregate_type", e.AggregateType, "aggregate_id", e.AggregateID,
			"aggregate_version", e.AggregateVersion, "event_type", e.Type, "event_id", e.ID)
	}
	s.nudge()
}

// logFailure logs a command whose transaction rolled back (W7). It names
// the command and the aggregate and states that no event was recorded:
// nothing reached the outbox, so nothing will ever be sent for it.
func (s *Service) logFailure(ctx context.Context, command string, id uuid.UUID, err error) {
	level, msg := slog.LevelError, "order command failed; transaction rolled back, no event recorded"
	if errors.Is(err, ErrUnavailable) {
		level, msg = slog.LevelWarn, "order command failed before commit (database or broker unavailable); rolled back, the client may retry"
	}
	if errors.Is(err, ErrCommitUnknown) {
		// The connection failed during COMMIT: the database may or may not
		// have committed. If it did, the events are in the outbox and will
		// be delivered; if not, nothing was recorded. Never claim either.
		msg = "order command failed during commit; outcome unknown, events exist only if the commit took effect"
	}
	var vc *VersionConflictError
	var te *TransitionError
	var ve *ValidationError
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrForbidden) || errors.Is(err, ErrEventTooLarge) ||
		errors.As(err, &vc) || errors.As(err, &te) || errors.As(err, &ve) {
		level, msg = slog.LevelInfo, "order command rejected; transaction rolled back, no event recorded"
	}
	s.log.Log(ctx, level, msg, "command", command, "aggregate_type", AggregateType, "aggregate_id", id, "error", err.Error())
}

// oneTrip sends b outside any explicit transaction, where PostgreSQL runs
// its statements as one implicit transaction: it commits when the batch
// ends, and a statement that fails skips the rest and rolls it all back.
// So an error the database returned means nothing committed, and so does
// one pgx reports as safe to retry (nothing was sent); any other error
// after the batch went out (the connection lost, the deadline reached)
// leaves the commit unknown, as a failed COMMIT does in inTx. Like that
// COMMIT, the batch does not follow the request's cancellation: a client
// hanging up must not turn a finished command into an unknown outcome.
func (s *Service) oneTrip(ctx context.Context, b *pgx.Batch) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return markUnavailable(ctx, fmt.Errorf("acquire a connection: %w", err))
	}
	defer conn.Release()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	err = conn.SendBatch(cctx, b).Close()
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pgErr) || pgconn.SafeToRetry(err):
		return markUnavailable(ctx, err)
	default:
		return fmt.Errorf("%w: %w", ErrCommitUnknown, err)
	}
}

// inTx runs fn in a transaction, committing if it returns nil and rolling
// back otherwise. The transaction never spans network calls other than to
// the database (W2): events are published later by the relay.
func (s *Service) inTx(ctx context.Context, fn func(tx pgx.Tx, q *ordersdb.Queries) error) (err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return markUnavailable(ctx, fmt.Errorf("begin: %w", err))
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err = fn(tx, ordersdb.New(tx)); err != nil {
		return markUnavailable(ctx, err)
	}
	// The commit does not follow the request's cancellation: a client
	// hanging up must not turn a finished command into an unknown outcome.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	if err = tx.Commit(cctx); err != nil {
		return fmt.Errorf("%w: %w", ErrCommitUnknown, err)
	}
	return nil
}

// markUnavailable marks a failure that cannot have committed anything (a
// read, or a transaction's work before its COMMIT; inTx reports a failed
// COMMIT as ErrCommitUnknown instead) as ErrUnavailable when it is the
// database's or the broker's passing trouble rather than the command's,
// so the caller may simply retry. A cancelled request stays as it is.
func markUnavailable(ctx context.Context, err error) error {
	if ctx.Err() != nil || !unavailable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// unavailable says whether err is a lost or refused database connection,
// a transient database condition, or a failed direct publish (O7).
func unavailable(err error) bool {
	if errors.Is(err, outbox.ErrDirectPublish) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			strings.HasPrefix(pgErr.Code, "53"),          // insufficient resources, e.g. too many connections
			strings.HasPrefix(pgErr.Code, "57P"),         // operator intervention: terminated, shutting down
			pgErr.Code == "40001", pgErr.Code == "40P01": // serialization failure, deadlock
			return true
		}
		return false
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || pgconn.SafeToRetry(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, puddle.ErrClosedPool)
}

// commitTimeout bounds a COMMIT that no longer follows the request context.
const commitTimeout = 10 * time.Second

func (s *Service) load(ctx context.Context, q *ordersdb.Queries, id uuid.UUID) (Order, error) {
	row, err := q.OrderGet(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Order{}, ErrNotFound
	}
	if err != nil {
		return Order{}, fmt.Errorf("read order: %w", err)
	}
	lines, err := q.OrderLinesList(ctx, id)
	if err != nil {
		return Order{}, fmt.Errorf("read order lines: %w", err)
	}
	return toOrder(row, lines), nil
}

func canSee(p auth.Principal, customer string) bool {
	return p.Role == auth.RoleAdmin || p.Role == auth.RoleService || p.Subject == customer
}

func toOrder(r ordersdb.Order, lines []ordersdb.OrderLine) Order {
	o := Order{
		ID: r.ID, Customer: r.Customer, Email: r.Email, Currency: r.Currency, Status: Status(r.Status),
		TotalCents: r.TotalCents, Version: r.Version, CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC(),
		Items: make([]Line, len(lines)),
	}
	for i, l := range lines {
		o.Items[i] = Line{SKU: l.SKU, Quantity: l.Quantity, UnitPriceCents: l.UnitPriceCents}
	}
	return o
}

func isUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == constraint
}
