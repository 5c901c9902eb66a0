package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/notify/notifydb"
)

// ErrProjectionRegressed means a projection write would have moved an
// order's state backwards. The inbox's ordering makes it impossible; the
// check stays so that a bug surfaces as an error instead of a wrong email.
var ErrProjectionRegressed = errors.New("notify: projection would move backwards")

// Projector applies order events to the local projection and writes the
// email intents into the send ledger, in the caller's transaction.
type Projector struct {
	log *slog.Logger
	// afterWrites, when set, runs after the projection update and the
	// ledger write, inside the transaction: the fault-injection point of
	// the V4 tests.
	afterWrites func(context.Context, pgx.Tx, inbox.Event) error
}

// NewProjector returns a Projector.
func NewProjector(log *slog.Logger) *Projector {
	if log == nil {
		log = slog.Default()
	}
	return &Projector{log: log}
}

// Apply is the inbox.ApplyFunc of the notifier. One order event becomes, in
// the same transaction as its processed_event marker: the projection's new
// state (last version, status, email) and, for the four emailed types, one
// pending send-ledger row. The email itself is sent later, outside any
// transaction, by the Sender.
func (p *Projector) Apply(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
	if !isKnownType(e.Type) {
		// The decoder parks such records before they reach the inbox: an
		// unknown type must never take a version (C7).
		return poison("event type %q is unknown to this notifier", e.Type)
	}
	orderID, err := uuid.Parse(e.AggregateID)
	if err != nil {
		return poison("aggregate id %q is not an order UUID", e.AggregateID)
	}
	payload, err := parsePayload(e)
	if err != nil {
		return err
	}
	q := notifydb.New(tx)
	cur, err := q.ProjectionGet(ctx, orderID)
	var prev *notifydb.OrderProjection
	switch {
	case err == nil:
		prev = &cur
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("read order projection: %w", err)
	}

	next, mail := project(prev, orderID, e, payload)
	n, err := q.ProjectionUpsert(ctx, next)
	if err != nil {
		return fmt.Errorf("update order projection: %w", err)
	}
	if n != 1 {
		return fmt.Errorf("%w: order %s, event v%d", ErrProjectionRegressed, orderID, e.AggregateVersion)
	}
	if mail != nil {
		if _, err := enqueueEmail(ctx, q, *mail); err != nil {
			return err
		}
	}
	if p.afterWrites != nil {
		if err := p.afterWrites(ctx, tx, e); err != nil {
			return err
		}
	}
	return nil
}

// Covered is the inbox's Covered function: the event's version was placed
// in the projection by a resync snapshot, so the projection is left alone,
// but the event still gets its email (C4a): a customer whose "paid" event
// was late still hears about the payment.
func (p *Projector) Covered(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
	mail, err := p.mailFor(e)
	if err != nil || mail == nil {
		return err
	}
	_, err = enqueueEmail(ctx, notifydb.New(tx), *mail)
	return err
}

// Rejected is the inbox's Rejected function: an emailing event that will
// never be applied (a conflict no one could settle, an order the orders
// service does not know, an event it did not write, or one an operator
// dropped) gets a ledger row in state skipped, with the reason, so every
// emailing event the notifier received is accounted for (C4a).
func (p *Projector) Rejected(ctx context.Context, tx pgx.Tx, e inbox.Event, reason string) error {
	mail, err := p.mailFor(e)
	if err != nil && e.Type != TypeRefundRequested {
		// The event is recorded (conflict or parked) with its payload; the
		// ledger row says why nothing was sent even though it cannot say
		// to whom.
		orderID, _ := uuid.Parse(e.AggregateID)
		mail = &emailIntent{EventID: e.ID, OrderID: orderID, EventType: e.Type,
			AggregateVersion: e.AggregateVersion, EventTime: e.Time, Traceparent: e.Traceparent, Tracestate: e.Tracestate}
	}
	if mail == nil {
		return nil
	}
	mail.SkipReason = map[string]string{
		inbox.RejectConflict: SkipConflict, inbox.RejectNotFound: SkipNotFound,
		inbox.RejectImpostor: SkipImpostor, inbox.RejectDropped: SkipDropped,
	}[reason]
	if mail.SkipReason == "" {
		mail.SkipReason = reason
	}
	_, err = enqueueEmail(ctx, notifydb.New(tx), *mail)
	return err
}

// mailFor returns the email an event asks for, if any, from its payload
// alone.
func (p *Projector) mailFor(e inbox.Event) (*emailIntent, error) {
	if !isKnownType(e.Type) {
		return nil, nil
	}
	orderID, err := uuid.Parse(e.AggregateID)
	if err != nil {
		return nil, poison("aggregate id %q is not an order UUID", e.AggregateID)
	}
	payload, err := parsePayload(e)
	if err != nil {
		return nil, err
	}
	_, mail := project(nil, orderID, e, payload)
	return mail, nil
}

// ApplySnapshot replaces an order's projection with the orders API's view
// during a resync. It writes no email: a snapshot is state, not an event.
// For an order whose history forked (s.Rebase) the snapshot replaces the
// projection whatever its version; otherwise it only moves it forward.
func (p *Projector) ApplySnapshot(ctx context.Context, tx pgx.Tx, s inbox.Snapshot) error {
	o, ok := s.State.(OrderSnapshot)
	if !ok {
		return fmt.Errorf("snapshot state is %T, want OrderSnapshot", s.State)
	}
	total := o.TotalCents
	if s.Rebase {
		if err := notifydb.New(tx).ProjectionReplace(ctx, notifydb.ProjectionReplaceParams{
			OrderID: o.ID, Email: o.Email, Status: o.Status, Currency: nonEmpty(o.Currency),
			TotalCents: &total, Version: s.Version,
		}); err != nil {
			return fmt.Errorf("replace forked projection: %w", err)
		}
		return nil
	}
	n, err := notifydb.New(tx).ProjectionUpsert(ctx, notifydb.ProjectionUpsertParams{
		OrderID: o.ID, Email: o.Email, Status: o.Status, Currency: nonEmpty(o.Currency),
		TotalCents: &total, Version: s.Version,
	})
	if err != nil {
		return fmt.Errorf("write snapshot projection: %w", err)
	}
	if n != 1 {
		return fmt.Errorf("%w: snapshot v%d of order %s", ErrProjectionRegressed, s.Version, o.ID)
	}
	return nil
}

// project computes the projection after e and the email it asks for. It is
// pure, so the business rules read in one place.
func project(prev *notifydb.OrderProjection, orderID uuid.UUID, e inbox.Event, payload any) (notifydb.ProjectionUpsertParams, *emailIntent) {
	next := notifydb.ProjectionUpsertParams{OrderID: orderID, Version: e.AggregateVersion, LastEventID: &e.ID}
	if prev != nil {
		next.Email, next.Status = prev.Email, prev.Status
	}
	var subject, body string
	switch v := payload.(type) {
	case *placedPayload:
		next.Email, next.Status, next.Currency, next.TotalCents = v.Email, "placed", nonEmpty(v.Currency), v.TotalCents
		subject, body = placedEmail(orderID, v)
	case *paidPayload:
		next.Email, next.Status, next.Currency, next.TotalCents = v.Email, "paid", nonEmpty(v.Currency), v.TotalCents
		subject, body = paidEmail(orderID, v)
	case *cancelledPayload:
		next.Email, next.Status = v.Email, "cancelled"
		subject, body = cancelledEmail(orderID, v)
	case *shippedPayload:
		next.Email, next.Status = v.Email, "shipped"
		subject, body = shippedEmail(orderID)
	case *refundRequestedPayload:
		// Updates the projection only: the customer already got the
		// cancellation email, which announces the refund.
		next.RefundRequestedCents = v.AmountCents
		if prev == nil {
			// Only reachable if the projection was lost; keep the row
			// valid and let the next snapshot or event fill it in.
			next.Status = "cancelled"
		}
		return next, nil
	}
	return next, &emailIntent{
		EventID: e.ID, OrderID: orderID, EventType: e.Type, AggregateVersion: e.AggregateVersion, EventTime: e.Time,
		Recipient: next.Email, Subject: subject, Body: body, Traceparent: e.Traceparent, Tracestate: e.Tracestate,
	}
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
