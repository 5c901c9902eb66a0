package notifyapi

import (
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/notify"
)

// The bodies of the admin API, shared by the handler and the Client.

// ParkedList is the body of GET /admin/parked.
type ParkedList struct {
	Records []ParkedRecord `json:"records"`
	// NextAfter, when set, is the ?after= of the next page of records.
	NextAfter int64 `json:"next_after,omitempty"`
	// Events are held events parked (first page only).
	Events []ParkedEvent `json:"events"`
}

// ParkedRecord is a parked record. Key, value and headers are only in
// GET /admin/parked/{id}: a key or value is text when it is valid UTF-8,
// else base64 (key_base64, value_base64); headers are stored the same way
// (inbox.ParkedHeader).
type ParkedRecord struct {
	ID             int64                `json:"id"`
	Topic          string               `json:"topic"`
	Partition      int32                `json:"partition"`
	Offset         int64                `json:"offset"`
	EventID        *uuid.UUID           `json:"event_id,omitempty"`
	Reason         string               `json:"reason"`
	ParkedAt       time.Time            `json:"parked_at"`
	Resolution     string               `json:"resolution,omitempty"`
	RetryOutcome   string               `json:"retry_outcome,omitempty"`
	ResolvedBy     string               `json:"resolved_by,omitempty"`
	ResolvedAt     *time.Time           `json:"resolved_at,omitempty"`
	ResolutionNote string               `json:"resolution_note,omitempty"`
	Retries        int                  `json:"retries"`
	Key            *string              `json:"key,omitempty"`
	KeyBase64      []byte               `json:"key_base64,omitempty"`
	Value          *string              `json:"value,omitempty"`
	ValueBase64    []byte               `json:"value_base64,omitempty"`
	Headers        []inbox.ParkedHeader `json:"headers,omitempty"`
}

// ParkedEvent is a held event that was parked, or rejected: the orders
// service did not write it at its version, or an operator dropped it
// (rejected_by). A rejected event holds no version.
type ParkedEvent struct {
	EventID          uuid.UUID  `json:"event_id"`
	AggregateType    string     `json:"aggregate_type"`
	AggregateID      string     `json:"aggregate_id"`
	AggregateVersion int64      `json:"aggregate_version"`
	EventType        string     `json:"event_type"`
	SchemaVersion    int        `json:"schema_version"`
	Reason           string     `json:"reason"`
	Rejected         bool       `json:"rejected,omitempty"`
	RejectedBy       string     `json:"rejected_by,omitempty"`
	HeldAt           time.Time  `json:"held_at"`
	ParkedAt         *time.Time `json:"parked_at,omitempty"`
}

// HeldList is the body of GET /admin/held: events waiting for an earlier
// version of their order.
type HeldList struct {
	Events []HeldEvent `json:"events"`
}

// HeldEvent is an event waiting for an earlier version.
type HeldEvent struct {
	EventID          uuid.UUID `json:"event_id"`
	AggregateType    string    `json:"aggregate_type"`
	AggregateID      string    `json:"aggregate_id"`
	AggregateVersion int64     `json:"aggregate_version"`
	EventType        string    `json:"event_type"`
	HeldAt           time.Time `json:"held_at"`
}

// DropRequest is the body of POST /admin/held/{event_id}/drop.
type DropRequest struct {
	Reason string `json:"reason"`
}

// DropResult is the answer to a drop: the event, now rejected, and the
// audit row.
type DropResult struct {
	EventID          uuid.UUID `json:"event_id"`
	AggregateID      string    `json:"aggregate_id"`
	AggregateVersion int64     `json:"aggregate_version"`
	EventType        string    `json:"event_type"`
	AuditID          int64     `json:"audit_id"`
}

// ConflictList is the body of GET /admin/conflicts.
type ConflictList struct {
	Conflicts []Conflict `json:"conflicts"`
}

// Conflict is an event refused because another owns its version.
type Conflict struct {
	EventID          uuid.UUID `json:"event_id"`
	AggregateType    string    `json:"aggregate_type"`
	AggregateID      string    `json:"aggregate_id"`
	AggregateVersion int64     `json:"aggregate_version"`
	EventType        string    `json:"event_type"`
	ExistingEventID  uuid.UUID `json:"existing_event_id"`
	DetectedAt       time.Time `json:"detected_at"`
	// Resolution is the orders service's verdict on the newcomer: genuine
	// (its email went out), impostor, unverified, or empty while pending.
	Resolution string     `json:"resolution,omitempty"`
	ResolvedAt *time.Time `json:"resolved_at,omitempty"`
}

// EmailList is the body of GET /admin/emails.
type EmailList struct {
	State  string  `json:"state"`
	Emails []Email `json:"emails"`
}

// Email is a send-ledger row: identifiers, state and errors, never the
// recipient or the message.
type Email struct {
	OperationKey   string     `json:"operation_key"`
	EventID        uuid.UUID  `json:"event_id"`
	EventType      string     `json:"event_type"`
	OrderID        uuid.UUID  `json:"order_id"`
	State          string     `json:"state"`
	Attempts       int        `json:"attempts"`
	CreatedAt      time.Time  `json:"created_at"`
	SentAt         *time.Time `json:"sent_at,omitempty"`
	SkipReason     string     `json:"skip_reason,omitempty"`
	LastErrorClass string     `json:"last_error_class,omitempty"`
	LastError      string     `json:"last_error,omitempty"`
	Resolution     string     `json:"resolution,omitempty"`
	ResolvedBy     string     `json:"resolved_by,omitempty"`
	ResolvedAt     *time.Time `json:"resolved_at,omitempty"`
	// MessageID is the Message-ID header of the email (every send of it
	// carries the same one).
	MessageID        string `json:"message_id"`
	AggregateVersion *int64 `json:"aggregate_version,omitempty"`
	SMTPReply        string `json:"smtp_reply,omitempty"`
}

// Journey is the body of GET /admin/events/{event_id}: the notifier's part
// of one event's journey.
type Journey struct {
	EventID uuid.UUID `json:"event_id"`
	// OrderID is the order asked for (?order_id=), or the one the marker
	// or the ledger names; absent when the notifier knows neither.
	OrderID *uuid.UUID `json:"order_id,omitempty"`
	// Inbox is absent when the inbox holds no marker of the event: not
	// received yet, or cleaned up after the inbox's TTL.
	Inbox *InboxMarker `json:"inbox,omitempty"`
	// InboxVersion is the highest version of the order the inbox applied.
	InboxVersion *int64      `json:"inbox_version,omitempty"`
	Projection   *Projection `json:"projection,omitempty"`
	// Emails are the order's ledger rows, oldest first.
	Emails []Email `json:"emails"`
}

// InboxMarker is the inbox's record of an event: received and processed
// times and what became of it (applied, held, superseded, conflict, parked).
type InboxMarker struct {
	AggregateType    string    `json:"aggregate_type"`
	AggregateID      string    `json:"aggregate_id"`
	AggregateVersion int64     `json:"aggregate_version"`
	EventType        string    `json:"event_type"`
	Outcome          string    `json:"outcome"`
	ReceivedAt       time.Time `json:"received_at"`
	ProcessedAt      time.Time `json:"processed_at"`
}

// Projection is the notifier's projection of the order, without the
// customer's address.
type Projection struct {
	Status      string     `json:"status"`
	Version     int64      `json:"version"`
	LastEventID *uuid.UUID `json:"last_event_id,omitempty"`
	UpdatedAt   time.Time  `json:"updated_at"`
}

// RetryRequest is the body of POST /admin/parked/{id}/retry.
type RetryRequest struct {
	Reason string `json:"reason"`
}

// RetryResult is the answer to a retry: applied, retried (taken by the
// inbox without a change: duplicate, held, conflict) or still_failing,
// with the error, in which case the record stays parked.
type RetryResult struct {
	ParkedRecord ParkedRecord `json:"parked_record"`
	Resolution   string       `json:"resolution"`
	Outcome      string       `json:"outcome,omitempty"`
	Error        string       `json:"error,omitempty"`
	AuditID      int64        `json:"audit_id"`
}

// ResolveRequest is the body of POST /admin/emails/{operation_key}/resolve.
type ResolveRequest struct {
	Resolution string `json:"resolution"`
	Reason     string `json:"reason"`
}

// ResolveResult is the email after the resolution.
type ResolveResult struct {
	Email      Email  `json:"email"`
	Resolution string `json:"resolution"`
	AuditID    int64  `json:"audit_id"`
}

func parkedRecord(p inbox.ParkedRecord, withBytes bool) ParkedRecord {
	out := ParkedRecord{
		ID: p.ID, Topic: p.Topic, Partition: p.Partition, Offset: p.Offset, EventID: p.EventID, Reason: p.Reason, ParkedAt: p.ParkedAt,
		Resolution: string(p.Resolution), RetryOutcome: string(p.RetryOutcome), ResolvedBy: p.ResolvedBy, ResolvedAt: p.ResolvedAt,
		ResolutionNote: p.ResolutionNote, Retries: p.Retries,
	}
	if withBytes {
		out.Key, out.KeyBase64 = textOrBase64(p.Key)
		out.Value, out.ValueBase64 = textOrBase64(p.Value)
		out.Headers = p.Headers
		if out.Headers == nil {
			out.Headers = []inbox.ParkedHeader{}
		}
	}
	return out
}

// textOrBase64 shows b as text when it is valid UTF-8 (JSON escapes the
// rest), as base64 otherwise.
func textOrBase64(b []byte) (*string, []byte) {
	if utf8.Valid(b) {
		s := string(b)
		return &s, nil
	}
	return nil, b
}

func parkedEvent(e inbox.ParkedEvent) ParkedEvent {
	return ParkedEvent{EventID: e.Event.ID, AggregateType: e.Event.AggregateType, AggregateID: e.Event.AggregateID,
		AggregateVersion: e.Event.AggregateVersion, EventType: e.Event.Type, SchemaVersion: e.Event.SchemaVersion,
		Reason: e.Reason, Rejected: e.Rejected, RejectedBy: e.RejectedBy, HeldAt: e.HeldAt, ParkedAt: e.ParkedAt}
}

func email(e notify.LedgerEmail) Email {
	return Email{OperationKey: e.OperationKey, EventID: e.EventID, EventType: e.EventType, OrderID: e.OrderID, State: e.State,
		Attempts: e.Attempts, CreatedAt: e.CreatedAt, SentAt: e.SentAt, SkipReason: e.SkipReason, LastErrorClass: e.LastErrorClass,
		LastError: e.LastError, Resolution: e.Resolution, ResolvedBy: e.ResolvedBy, ResolvedAt: e.ResolvedAt,
		MessageID: e.MessageID, AggregateVersion: e.AggregateVersion, SMTPReply: e.SMTPReply}
}

func journey(j notify.Journey) Journey {
	out := Journey{EventID: j.EventID, OrderID: j.OrderID, InboxVersion: j.InboxVersion, Emails: make([]Email, 0, len(j.Emails))}
	if m := j.Marker; m != nil {
		out.Inbox = &InboxMarker{AggregateType: m.AggregateType, AggregateID: m.AggregateID, AggregateVersion: m.AggregateVersion,
			EventType: m.EventType, Outcome: m.Outcome, ReceivedAt: m.ReceivedAt, ProcessedAt: m.ProcessedAt}
	}
	if p := j.Projection; p != nil {
		out.Projection = &Projection{Status: p.Status, Version: p.Version, LastEventID: p.LastEventID, UpdatedAt: p.UpdatedAt}
	}
	for _, e := range j.Emails {
		out.Emails = append(out.Emails, email(e))
	}
	return out
}
