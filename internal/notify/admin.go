package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/notify/notifydb"
	"github.com/outboxref/orders/internal/outbox/adminguard"
)

// Admin is the notifier's side for operators (O4): what the inbox parked
// or refused, the send ledger's rows that wait for a decision, and the two
// decisions an operator takes, retrying a parked record and resolving an
// email. Every write runs in one transaction with its row of admin_audit:
// who (the actor), why (a reason, required), what and on which row, and
// the SHA-256 of the row's JSON before and after. A decision is therefore
// never applied without its record, nor recorded without being applied.
type Admin struct {
	pool   *pgxpool.Pool
	inbox  *inbox.Inbox
	decode inbox.DecodeFunc
	nudge  func()
	log    *slog.Logger
}

// AdminConfig is what an Admin needs.
type AdminConfig struct {
	Pool *pgxpool.Pool
	// Inbox retries parked records; an Admin without one can do
	// everything else.
	Inbox *inbox.Inbox
	// Decode reads a parked record again when it is retried. Nil means
	// DecodeRecord: the notifier's decoder as deployed now, so a fix
	// deployed since the record was parked is what the retry runs.
	Decode inbox.DecodeFunc
	// Nudge wakes the email sender after a decision created work for it;
	// nil means none.
	Nudge  func()
	Logger *slog.Logger
}

// NewAdmin returns an Admin.
func NewAdmin(cfg AdminConfig) *Admin {
	a := &Admin{pool: cfg.Pool, inbox: cfg.Inbox, decode: cfg.Decode, nudge: cfg.Nudge, log: cfg.Logger}
	if a.decode == nil {
		a.decode = DecodeRecord
	}
	if a.nudge == nil {
		a.nudge = func() {}
	}
	if a.log == nil {
		a.log = slog.Default()
	}
	return a
}

// Admin returns the operator side of the running service: its inbox, and
// its sender to nudge.
func (s *Service) Admin() *Admin {
	return NewAdmin(AdminConfig{Pool: s.pool, Inbox: s.Inbox, Decode: s.decode, Nudge: s.Sender.Nudge, Logger: s.log})
}

// Errors of the Admin, beside inbox.ErrParkedRecordNotFound,
// inbox.ErrAlreadyResolved and ErrNotResolvable.
var (
	// ErrInvalidReason: a decision needs a reason, one line of printable
	// text of at most MaxReasonChars characters.
	ErrInvalidReason = errors.New("a reason is required: one line of printable text")
	// ErrInvalidResolution: an email resolution is sent, resend or failed.
	ErrInvalidResolution = errors.New("resolution: want sent, resend or failed")
	// ErrInvalidState: not a state of the send ledger.
	ErrInvalidState = errors.New("not a ledger state")
	// ErrEmailNotFound: no ledger row has that operation key.
	ErrEmailNotFound = errors.New("no such email")
)

// MaxReasonChars bounds the reason of a decision (admin_audit.reason), in
// characters: the same limit as the outbox's audit, from the rule both
// admin APIs share.
const MaxReasonChars = adminguard.MaxReasonChars

// CheckReason returns ErrInvalidReason unless reason is a usable reason:
// not blank, and text by adminguard.CheckReason.
func CheckReason(reason string) error {
	if strings.TrimSpace(reason) == "" || adminguard.CheckReason(reason) != nil {
		return ErrInvalidReason
	}
	return nil
}

// LedgerStates are the states of the send ledger (C4), for listing.
var LedgerStates = []string{StatePending, StateSending, StateSent, StateUnknown, StateFailed, StateSkipped}

// Audit actions, the action column of admin_audit.
const (
	ActionRetryParked  = "parked_record.retry"
	ActionResolveEmail = "email.resolve"
	ActionDropHeld     = "held_event.drop"
)

// AuditEntry is one row of admin_audit.
type AuditEntry struct {
	ID           int64
	At           time.Time
	Actor        string
	Action       string
	Target       string
	Reason       string
	BeforeSHA256 []byte
	AfterSHA256  []byte
}

// ParkedRecords lists parked records, oldest first, without their bytes.
func (a *Admin) ParkedRecords(ctx context.Context, o inbox.ParkedListOptions) ([]inbox.ParkedRecord, error) {
	return inbox.ParkedRecords(ctx, a.pool, o)
}

// ParkedEvents lists held events that were parked, oldest first.
func (a *Admin) ParkedEvents(ctx context.Context, limit int) ([]inbox.ParkedEvent, error) {
	return inbox.ParkedEvents(ctx, a.pool, limit)
}

// ParkedRecord returns one parked record with its bytes.
func (a *Admin) ParkedRecord(ctx context.Context, id int64) (inbox.ParkedRecord, error) {
	return inbox.ParkedRecordByID(ctx, a.pool, id)
}

// Conflicts lists the inbox's conflicts, oldest first.
func (a *Admin) Conflicts(ctx context.Context, limit int) ([]inbox.ConflictRecord, error) {
	return inbox.Conflicts(ctx, a.pool, limit)
}

// HeldEvents lists the events still held for an earlier version, oldest
// first.
func (a *Admin) HeldEvents(ctx context.Context, limit int) ([]inbox.HeldEvent, error) {
	return inbox.HeldEvents(ctx, a.pool, limit)
}

// DropResult is what dropping a held event did, and its audit row.
type DropResult struct {
	Event inbox.Event
	Audit AuditEntry
}

// DropHeld takes a held or parked event out of its order's sequence for
// good (an event that can never become due: a forged version the orders
// API cannot judge, say), in one transaction with the audit row. Its email,
// if it asked for one, is recorded as skipped (dropped). A missing or
// already dropped event is inbox.ErrHeldEventNotFound.
func (a *Admin) DropHeld(ctx context.Context, eventID uuid.UUID, actor, reason string) (DropResult, error) {
	if err := CheckReason(reason); err != nil {
		return DropResult{}, err
	}
	if a.inbox == nil {
		return DropResult{}, errors.New("drop held event: this Admin has no inbox")
	}
	var out DropResult
	var d inbox.Drop
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		var err error
		if d, err = a.inbox.DropHeld(ctx, tx, eventID, actor, reason); err != nil {
			return err
		}
		e := d.Event
		out.Event = e
		out.Audit, err = audit(ctx, tx, AuditEntry{Actor: actor, Action: ActionDropHeld, Target: "inbox_held_event/" + eventID.String(), Reason: reason,
			BeforeSHA256: d.BeforeSHA256, AfterSHA256: d.AfterSHA256},
			map[string]string{"event_type": e.Type, "aggregate_id": e.AggregateID, "aggregate_version": fmt.Sprint(e.AggregateVersion)})
		return err
	})
	if err != nil {
		return DropResult{}, fmt.Errorf("drop held event %s: %w", eventID, err)
	}
	d.Observe()
	a.log.InfoContext(ctx, "admin: held event dropped", append(out.Event.LogAttrs(), slog.String("actor", actor), slog.Int64("audit_id", out.Audit.ID))...)
	return out, nil
}

// RetryResult is what a retry of a parked record did, and its audit row.
type RetryResult struct {
	inbox.Retry
	Audit AuditEntry
}

// RetryParked retries parked record id with the notifier's decoder and its
// inbox, in one transaction with the audit row (actor, reason). A record
// that still fails stays parked with the new reason; that is a result, not
// an error. After the commit the inbox counts the outcome, and the sender
// is nudged when an email may be due.
func (a *Admin) RetryParked(ctx context.Context, id int64, actor, reason string) (RetryResult, error) {
	if err := CheckReason(reason); err != nil {
		return RetryResult{}, err
	}
	if a.inbox == nil {
		return RetryResult{}, errors.New("retry parked record: this Admin has no inbox")
	}
	var out RetryResult
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		r, err := a.inbox.RetryParked(ctx, tx, id, actor, reason, a.decode)
		if err != nil {
			return err
		}
		detail := map[string]string{"resolution": string(r.Resolution)}
		if r.Result.Outcome != "" {
			detail["outcome"] = string(r.Result.Outcome)
		}
		if r.Record.EventID != nil {
			detail["event_id"] = r.Record.EventID.String()
		}
		out.Retry = r
		out.Audit, err = audit(ctx, tx, AuditEntry{Actor: actor, Action: ActionRetryParked, Target: fmt.Sprintf("inbox_parked_record/%d", id),
			Reason: reason, BeforeSHA256: r.BeforeSHA256, AfterSHA256: r.AfterSHA256}, detail)
		return err
	})
	if err != nil {
		return RetryResult{}, fmt.Errorf("retry parked record %d: %w", id, err)
	}
	if out.Result.Outcome != "" {
		a.inbox.Observe(out.Result)
	}
	if out.Resolution == inbox.ResolutionApplied {
		a.nudge()
	}
	attrs := []any{slog.String("actor", actor), slog.Int64("parked_record_id", id), slog.String("resolution", string(out.Resolution)),
		slog.String("outcome", string(out.Result.Outcome)), slog.Int64("audit_id", out.Audit.ID)}
	if out.Err != nil {
		a.log.WarnContext(ctx, "admin: parked record retried and still failing; it stays parked", append(attrs, slog.String("error", out.Err.Error()))...)
	} else {
		a.log.InfoContext(ctx, "admin: parked record retried", attrs...)
	}
	return out, nil
}

// LedgerEmail is a send-ledger row as an operator sees it: identifiers,
// state and errors, never the recipient or the message.
type LedgerEmail struct {
	OperationKey   string
	EventID        uuid.UUID
	EventType      string
	OrderID        uuid.UUID
	State          string
	Attempts       int
	CreatedAt      time.Time
	SentAt         *time.Time
	SkipReason     string
	LastErrorClass string
	LastError      string
	Resolution     string
	ResolvedBy     string
	ResolvedAt     *time.Time
	// MessageID is the Message-ID header every send of this email carries.
	MessageID string
	// AggregateVersion is the order's version the email is about (none
	// on rows written before versions were recorded).
	AggregateVersion *int64
	// SMTPReply is the server's answer to the accepted send.
	SMTPReply string
}

func ledgerEmail(r notifydb.EmailSend) LedgerEmail {
	d := func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	}
	return LedgerEmail{
		OperationKey: r.OperationKey, EventID: r.EventID, EventType: r.EventType, OrderID: r.OrderID, State: r.State,
		Attempts: int(r.Attempts), CreatedAt: r.CreatedAt, SentAt: r.SentAt, SkipReason: d(r.SkipReason),
		LastErrorClass: d(r.LastErrorClass), LastError: d(r.LastError), Resolution: d(r.Resolution), ResolvedBy: d(r.ResolvedBy),
		ResolvedAt: r.ResolvedAt, MessageID: r.MessageID, AggregateVersion: r.AggregateVersion, SMTPReply: d(r.SMTPReply),
	}
}

// Emails lists ledger rows in state, oldest first.
func (a *Admin) Emails(ctx context.Context, state string, limit int) ([]LedgerEmail, error) {
	if !validState(state) {
		return nil, fmt.Errorf("state %q: %w", state, ErrInvalidState)
	}
	rows, err := notifydb.New(a.pool).EmailSendListByState(ctx, notifydb.EmailSendListByStateParams{State: state, RowLimit: int32(max(limit, 1))})
	if err != nil {
		return nil, fmt.Errorf("list %s emails: %w", state, err)
	}
	out := make([]LedgerEmail, 0, len(rows))
	for _, r := range rows {
		out = append(out, ledgerEmail(r))
	}
	return out, nil
}

func validState(s string) bool {
	for _, st := range LedgerStates {
		if s == st {
			return true
		}
	}
	return false
}

// ResolveResult is an email after an operator's resolution, and its audit
// row.
type ResolveResult struct {
	Email LedgerEmail
	Audit AuditEntry
}

// ResolveEmail records and applies an operator's decision about an
// unknown or failed email (sent, resend or failed; see the package-level
// ResolveEmail), in one transaction with the audit row (actor, reason).
func (a *Admin) ResolveEmail(ctx context.Context, operationKey, resolution, actor, reason string) (ResolveResult, error) {
	if err := CheckReason(reason); err != nil {
		return ResolveResult{}, err
	}
	switch resolution {
	case ResolveSent, ResolveResend, ResolveFailed:
	default:
		return ResolveResult{}, fmt.Errorf("%q: %w", resolution, ErrInvalidResolution)
	}
	var out ResolveResult
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		q := notifydb.New(tx)
		if err := q.AdminRowHashSettings(ctx); err != nil {
			return err
		}
		before, err := q.EmailSendLockForResolve(ctx, operationKey)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrEmailNotFound
		}
		if err != nil {
			return err
		}
		if err := ResolveEmail(ctx, tx, operationKey, resolution, actor); err != nil {
			return err
		}
		after, err := q.EmailSendLockForResolve(ctx, operationKey)
		if err != nil {
			return err
		}
		out.Email = ledgerEmail(after.EmailSend)
		out.Audit, err = audit(ctx, tx, AuditEntry{Actor: actor, Action: ActionResolveEmail, Target: "email_send/" + operationKey,
			Reason: reason, BeforeSHA256: before.RowSha256, AfterSHA256: after.RowSha256},
			map[string]string{"resolution": resolution, "from_state": before.EmailSend.State, "event_id": before.EmailSend.EventID.String()})
		return err
	})
	if err != nil {
		return ResolveResult{}, fmt.Errorf("resolve email %s: %w", operationKey, err)
	}
	if resolution == ResolveResend {
		a.nudge()
	}
	a.log.InfoContext(ctx, "admin: email resolved", slog.String("actor", actor), slog.String("operation_key", operationKey),
		slog.String("event_id", out.Email.EventID.String()), slog.String("resolution", resolution), slog.String("state", out.Email.State),
		slog.Int64("audit_id", out.Audit.ID))
	return out, nil
}

// audit writes one admin_audit row in tx, the decision's transaction.
func audit(ctx context.Context, tx pgx.Tx, e AuditEntry, detail map[string]string) (AuditEntry, error) {
	dj, err := json.Marshal(detail)
	if err != nil {
		return AuditEntry{}, fmt.Errorf("audit detail: %w", err)
	}
	row, err := notifydb.New(tx).AdminAuditInsert(ctx, notifydb.AdminAuditInsertParams{
		Actor: e.Actor, Action: e.Action, Target: e.Target, Reason: e.Reason,
		BeforeSha256: e.BeforeSHA256, AfterSha256: e.AfterSHA256, Detail: dj,
	})
	if err != nil {
		return AuditEntry{}, fmt.Errorf("write audit row: %w", err)
	}
	e.ID, e.At = row.ID, row.At
	return e, nil
}
