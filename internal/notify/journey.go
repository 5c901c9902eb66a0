package notify

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/orders/internal/notify/notifydb"
)

// Journey is what the notifier knows of one event, for an operator
// following it from the orders service to the customer's email: the
// inbox's marker, the version the inbox and the projection hold for its
// order, and the order's send-ledger rows.
type Journey struct {
	EventID uuid.UUID
	// OrderID is the order asked for, or the one the marker or the
	// ledger names; nil when the notifier knows neither.
	OrderID *uuid.UUID
	// Marker is nil when the inbox holds no marker of the event: not
	// received yet, or cleaned up after the inbox's TTL.
	Marker *InboxMarker
	// InboxVersion is the highest version of the order the inbox
	// applied; nil when the inbox has never seen the order.
	InboxVersion *int64
	// Projection is nil when the notifier holds no projection of the order.
	Projection *ProjectionState
	// Emails are the order's ledger rows, oldest first (the event's own
	// row when no order is known).
	Emails []LedgerEmail
}

// InboxMarker is the inbox's record of an event (processed_event).
type InboxMarker struct {
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	EventType        string
	// Outcome is applied, held, superseded, conflict or parked.
	Outcome     string
	ReceivedAt  time.Time
	ProcessedAt time.Time
}

// ProjectionState is the order's projection without the customer's address.
type ProjectionState struct {
	Status      string
	Version     int64
	LastEventID *uuid.UUID
	UpdatedAt   time.Time
}

// Journey reads the notifier's part of an event's journey. orderID may be
// nil: the order is then the one the marker or the ledger row names. An
// event the notifier never saw is not an error: the answer says what is
// there.
func (a *Admin) Journey(ctx context.Context, eventID uuid.UUID, orderID *uuid.UUID) (Journey, error) {
	q := notifydb.New(a.pool)
	j := Journey{EventID: eventID, OrderID: orderID, Emails: []LedgerEmail{}}
	m, err := q.JourneyInboxMarker(ctx, eventID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return Journey{}, fmt.Errorf("read the inbox marker of event %s: %w", eventID, err)
	default:
		j.Marker = &InboxMarker{AggregateType: m.AggregateType, AggregateID: m.AggregateID, AggregateVersion: m.AggregateVersion,
			EventType: m.EventType, Outcome: m.Outcome, ReceivedAt: m.ReceivedAt, ProcessedAt: m.ProcessedAt}
		if m.AggregateType == AggregateType {
			j.InboxVersion = m.InboxVersion
			if id, err := uuid.Parse(m.AggregateID); err == nil && j.OrderID == nil {
				j.OrderID = &id
			}
		}
	}
	if j.OrderID == nil {
		e, err := q.JourneyEmailByEvent(ctx, eventID)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return j, nil
		case err != nil:
			return Journey{}, fmt.Errorf("read the ledger row of event %s: %w", eventID, err)
		}
		j.OrderID = &e.OrderID
	}
	if j.InboxVersion == nil || j.Marker.AggregateID != j.OrderID.String() {
		j.InboxVersion = nil
		v, err := q.JourneyInboxVersion(ctx, notifydb.JourneyInboxVersionParams{AggregateType: AggregateType, AggregateID: j.OrderID.String()})
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return Journey{}, fmt.Errorf("read the inbox version of order %s: %w", j.OrderID, err)
		default:
			j.InboxVersion = &v
		}
	}
	p, err := q.JourneyProjection(ctx, *j.OrderID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return Journey{}, fmt.Errorf("read the projection of order %s: %w", j.OrderID, err)
	default:
		j.Projection = &ProjectionState{Status: p.Status, Version: p.Version, LastEventID: p.LastEventID, UpdatedAt: p.UpdatedAt}
	}
	rows, err := q.EmailSendListByOrder(ctx, *j.OrderID)
	if err != nil {
		return Journey{}, fmt.Errorf("read the ledger rows of order %s: %w", j.OrderID, err)
	}
	for _, r := range rows {
		j.Emails = append(j.Emails, ledgerEmail(r))
	}
	return j, nil
}
