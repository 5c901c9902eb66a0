package notify

import (
	"cmp"
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/notify/notifydb"
)

// ApplyBatch is the inbox.BatchApplyFunc of the notifier: Apply for several
// events, with the same result as Apply called for each in order, written
// with four statements for the whole batch instead of four per event. The
// projections of the batch's orders are read once, each event's new state
// is computed in memory from the one before it (several events of an
// order fold into one row), and the rows and the ledger's pending emails
// are written set-based. The "arrives late" check of the ledger is one
// read, too: the batch's own emails of an order are for increasing
// versions, so only emails written before the batch can be later than one
// of them.
func (p *Projector) ApplyBatch(ctx context.Context, tx pgx.Tx, events []inbox.Event) error {
	type step struct {
		index   int
		orderID uuid.UUID
		payload any
	}
	steps := make([]step, 0, len(events))
	var orderIDs []uuid.UUID
	first := map[uuid.UUID]int{} // an order's first event in the batch
	for i, e := range events {
		if !isKnownType(e.Type) {
			// Parked by the decoder before it gets here (C7), as in Apply.
			return &inbox.EventError{Index: i, Err: poison("event type %q is unknown to this notifier", e.Type)}
		}
		orderID, err := uuid.Parse(e.AggregateID)
		if err != nil {
			return &inbox.EventError{Index: i, Err: poison("aggregate id %q is not an order UUID", e.AggregateID)}
		}
		payload, err := parsePayload(e)
		if err != nil {
			return &inbox.EventError{Index: i, Err: err}
		}
		if _, ok := first[orderID]; !ok {
			first[orderID] = i
			orderIDs = append(orderIDs, orderID)
		}
		steps = append(steps, step{index: i, orderID: orderID, payload: payload})
	}
	if len(steps) == 0 {
		return nil
	}

	q := notifydb.New(tx)
	rows, err := q.ProjectionGetMany(ctx, orderIDs)
	if err != nil {
		return fmt.Errorf("read order projections: %w", err)
	}
	state := make(map[uuid.UUID]*notifydb.OrderProjection, len(orderIDs))
	for i := range rows {
		r := &rows[i]
		// As in Apply, a stored state at or past the event's version is a
		// bug surfacing, never overwritten.
		if i := first[r.OrderID]; r.Version >= events[i].AggregateVersion {
			return &inbox.EventError{Index: i, Err: fmt.Errorf("%w: order %s, event v%d",
				ErrProjectionRegressed, r.OrderID, events[i].AggregateVersion)}
		}
		state[r.OrderID] = r
	}
	latest, err := q.EmailSendLatestVersions(ctx, orderIDs)
	if err != nil {
		return fmt.Errorf("look for later emails: %w", err)
	}
	latestEmail := make(map[uuid.UUID]int64, len(latest))
	for _, l := range latest {
		latestEmail[l.OrderID] = l.LatestVersion
	}

	var mails notifydb.EmailSendInsertManyParams
	for _, s := range steps {
		e := events[s.index]
		prev := state[s.orderID]
		next, mail := project(prev, s.orderID, e, s.payload)
		state[s.orderID] = fold(prev, next)
		if mail == nil {
			continue
		}
		if v, ok := latestEmail[s.orderID]; ok && v > mail.AggregateVersion {
			markLate(mail)
		}
		mails.OperationKeys = append(mails.OperationKeys, OperationKey(mail.EventID))
		mails.EventIDs = append(mails.EventIDs, mail.EventID)
		mails.MessageIDs = append(mails.MessageIDs, MessageID(mail.EventID))
		mails.OrderIDs = append(mails.OrderIDs, mail.OrderID)
		mails.EventTypes = append(mails.EventTypes, mail.EventType)
		mails.AggregateVersions = append(mails.AggregateVersions, mail.AggregateVersion)
		mails.EventTimes = append(mails.EventTimes, mail.EventTime)
		mails.Recipients = append(mails.Recipients, mail.Recipient)
		mails.Subjects = append(mails.Subjects, mail.Subject)
		mails.Bodies = append(mails.Bodies, mail.Body)
		mails.Traceparents = append(mails.Traceparents, mail.Traceparent)
		mails.Tracestates = append(mails.Tracestates, mail.Tracestate)
	}

	var up notifydb.ProjectionUpsertManyParams
	for _, id := range orderIDs {
		s := state[id]
		up.OrderIDs = append(up.OrderIDs, id)
		up.Emails = append(up.Emails, s.Email)
		up.Statuses = append(up.Statuses, s.Status)
		up.Currencies = append(up.Currencies, deref(s.Currency))
		up.TotalCents = append(up.TotalCents, deref(s.TotalCents))
		up.HasTotal = append(up.HasTotal, s.TotalCents != nil)
		up.RefundCents = append(up.RefundCents, deref(s.RefundRequestedCents))
		up.HasRefund = append(up.HasRefund, s.RefundRequestedCents != nil)
		up.Versions = append(up.Versions, s.Version)
		up.LastEventIDs = append(up.LastEventIDs, deref(s.LastEventID))
	}
	n, err := q.ProjectionUpsertMany(ctx, up)
	if err != nil {
		return fmt.Errorf("update order projections: %w", err)
	}
	if n != int64(len(orderIDs)) {
		return fmt.Errorf("%w: %d of %d orders written", ErrProjectionRegressed, n, len(orderIDs))
	}
	if len(mails.OperationKeys) > 0 {
		if err := q.EmailSendInsertMany(ctx, mails); err != nil {
			return fmt.Errorf("write email intents: %w", err)
		}
	}
	if p.afterWrites != nil {
		for _, s := range steps {
			if err := p.afterWrites(ctx, tx, events[s.index]); err != nil {
				return &inbox.EventError{Index: s.index, Err: err}
			}
		}
	}
	return nil
}

// fold is the stored row ProjectionUpsert leaves after writing next over
// prev (nil when the order has no row): the nullable columns keep their
// value when next has none.
func fold(prev *notifydb.OrderProjection, next notifydb.ProjectionUpsertParams) *notifydb.OrderProjection {
	r := &notifydb.OrderProjection{
		OrderID: next.OrderID, Email: next.Email, Status: next.Status, Currency: next.Currency,
		TotalCents: next.TotalCents, RefundRequestedCents: next.RefundRequestedCents,
		Version: next.Version, LastEventID: next.LastEventID,
	}
	if prev != nil {
		r.Currency = cmp.Or(r.Currency, prev.Currency)
		r.TotalCents = cmp.Or(r.TotalCents, prev.TotalCents)
		r.RefundRequestedCents = cmp.Or(r.RefundRequestedCents, prev.RefundRequestedCents)
	}
	return r
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
