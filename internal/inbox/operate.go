package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/inbox/internal/inboxdb"
)

// Operating the inbox (O4): what it parked or refused, listed for an
// operator, and a parked record retried once whatever made it
// unprocessable has been fixed (usually the consumer's code: a schema
// version it now reads, a bug in its change). The event keeps its
// identity: the retry decodes the very bytes that were parked and runs
// them through Process, so a retried event is recognised by its event_id
// like any redelivery, and nothing is re-created around it.

// ErrParkedRecordNotFound is returned for a parked record id that does not
// exist.
var ErrParkedRecordNotFound = errors.New("inbox: no such parked record")

// ErrAlreadyResolved is returned by RetryParked for a record whose retry
// already got through (applied or retried): it is no longer parked.
var ErrAlreadyResolved = errors.New("inbox: parked record already resolved")

// Resolution is what became of a parked record that was retried.
type Resolution string

// The resolutions of RetryParked.
const (
	// ResolutionApplied: the event went through the inbox and its change
	// ran (or, its version covered by a snapshot, its effects did).
	ResolutionApplied Resolution = "applied"
	// ResolutionRetried: the inbox took the event without a change of its
	// own: a duplicate, a conflict, or held until a gap is filled.
	ResolutionRetried Resolution = "retried"
	// ResolutionStillFailing: it still cannot be decoded or processed; it
	// stays parked with the new reason and may be retried again.
	ResolutionStillFailing Resolution = "still_failing"
)

// ParkedRecord is a record stored by ParkRecord, and what became of it.
type ParkedRecord struct {
	ID        int64
	Topic     string
	Partition int32
	Offset    int64
	// EventID is the record's ce_id, when it held a readable event id.
	EventID  *uuid.UUID
	Reason   string
	ParkedAt time.Time
	// Key, Value and Headers are the record's bytes as they arrived; lists
	// leave them out (ParkedRecordByID has them).
	Key     []byte
	Value   []byte
	Headers []ParkedHeader

	// Resolution is empty until the record is retried.
	Resolution Resolution
	// RetryOutcome is the inbox's outcome of the retry that got through.
	RetryOutcome   Outcome
	ResolvedBy     string
	ResolvedAt     *time.Time
	ResolutionNote string
	Retries        int
}

// Open reports whether the record is still parked: never retried, or
// retried and still failing.
func (p ParkedRecord) Open() bool {
	return p.Resolution == "" || p.Resolution == ResolutionStillFailing
}

// Record rebuilds the Kafka record from the stored bytes, for decoding it
// again.
func (p ParkedRecord) Record() *kgo.Record {
	r := &kgo.Record{Topic: p.Topic, Partition: p.Partition, Offset: p.Offset, Key: p.Key, Value: p.Value}
	for _, h := range p.Headers {
		k, v := h.Key, []byte(h.Value)
		if h.KeyBase64 != nil {
			k = string(h.KeyBase64)
		}
		if h.ValueBase64 != nil {
			v = h.ValueBase64
		}
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: v})
	}
	return r
}

// ParkedListOptions selects parked records for ParkedRecords.
type ParkedListOptions struct {
	// After is a cursor: only records with a larger id (0 for the first
	// page; the last id of a page for the next).
	After int64
	// Limit bounds the page (at least 1).
	Limit int
	// IncludeResolved lists retried records too, not only the open ones.
	IncludeResolved bool
}

// ParkedRecords lists parked records, oldest first, without their bytes.
func ParkedRecords(ctx context.Context, db DBTX, o ParkedListOptions) ([]ParkedRecord, error) {
	rows, err := inboxdb.New(db).InboxParkedRecordListSummary(ctx, inboxdb.InboxParkedRecordListSummaryParams{
		AfterID: o.After, IncludeResolved: o.IncludeResolved, RowLimit: int32(max(o.Limit, 1)),
	})
	if err != nil {
		return nil, fmt.Errorf("list parked records: %w", err)
	}
	out := make([]ParkedRecord, 0, len(rows))
	for _, r := range rows {
		out = append(out, parkedRecord(inboxdb.InboxParkedRecord{
			ID: r.ID, Source: r.Source, Partition: r.Partition, Offset: r.Offset, EventID: r.EventID, Reason: r.Reason,
			ParkedAt: r.ParkedAt, Resolution: r.Resolution, RetryOutcome: r.RetryOutcome, ResolvedBy: r.ResolvedBy,
			ResolvedAt: r.ResolvedAt, Retries: r.Retries,
		}))
	}
	return out, nil
}

// ParkedRecordByID returns one parked record with its bytes, or
// ErrParkedRecordNotFound.
func ParkedRecordByID(ctx context.Context, db DBTX, id int64) (ParkedRecord, error) {
	row, err := inboxdb.New(db).InboxParkedRecordGet(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return ParkedRecord{}, fmt.Errorf("parked record %d: %w", id, ErrParkedRecordNotFound)
	}
	if err != nil {
		return ParkedRecord{}, fmt.Errorf("read parked record %d: %w", id, err)
	}
	p := parkedRecord(row)
	if err := json.Unmarshal(row.Headers, &p.Headers); err != nil {
		return ParkedRecord{}, fmt.Errorf("read parked record %d: headers: %w", id, err)
	}
	return p, nil
}

func parkedRecord(r inboxdb.InboxParkedRecord) ParkedRecord {
	return ParkedRecord{
		ID: r.ID, Topic: r.Source, Partition: r.Partition, Offset: r.Offset, EventID: r.EventID, Reason: r.Reason,
		ParkedAt: r.ParkedAt, Key: r.RecordKey, Value: r.RecordValue,
		Resolution: Resolution(deref(r.Resolution)), RetryOutcome: Outcome(deref(r.RetryOutcome)), ResolvedBy: deref(r.ResolvedBy),
		ResolvedAt: r.ResolvedAt, ResolutionNote: deref(r.ResolutionNote), Retries: int(r.Retries),
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// ParkedEvent is a held event that was parked or rejected. Parked: a
// resync could not place it (the source of truth does not know its
// aggregate), or its change failed when its turn came; it still owns its
// version. Rejected: the source of truth did not write it at its version,
// or an operator dropped it (DropHeld); it owns no version.
type ParkedEvent struct {
	// Event is the event without its payload.
	Event  Event
	Reason string
	// Rejected is set for an event that gave its version up; RejectedBy
	// names the operator who dropped it, empty when a resync did.
	Rejected   bool
	RejectedBy string
	HeldAt     time.Time
	ParkedAt   *time.Time
}

// HeldEvent is an event waiting for an earlier version of its aggregate.
type HeldEvent struct {
	// Event is the event without its payload.
	Event  Event
	HeldAt time.Time
}

// HeldEvents lists the events still held, oldest first.
func HeldEvents(ctx context.Context, db DBTX, limit int) ([]HeldEvent, error) {
	rows, err := inboxdb.New(db).InboxHeldWaitingList(ctx, int32(max(limit, 1)))
	if err != nil {
		return nil, fmt.Errorf("list held events: %w", err)
	}
	out := make([]HeldEvent, 0, len(rows))
	for _, r := range rows {
		out = append(out, HeldEvent{
			Event: Event{ID: r.EventID, AggregateType: r.AggregateType, AggregateID: r.AggregateID, AggregateVersion: r.AggregateVersion,
				Type: r.EventType, SchemaVersion: int(r.SchemaVersion), Time: r.EventTime},
			HeldAt: r.HeldAt,
		})
	}
	return out, nil
}

// ErrHeldEventNotFound is returned by DropHeld for an event that is not
// held or parked (never held, applied since, or already dropped).
var ErrHeldEventNotFound = errors.New("inbox: no held or parked event with this id")

// DropHeld takes a held or parked event out of its aggregate's sequence
// for good, in the caller's transaction tx: an operator's decision for an
// event that can never become due (a forged record the resync could not
// judge, say). The event keeps its marker (a redelivery is a duplicate)
// and its bytes, marked rejected with the actor and reason; the consumer's
// Rejected function runs with RejectDropped so that effects owed to it are
// accounted for; and if nothing else is held, the aggregate's gap closes.
// The caller audits (Drop has the row's hashes before and after) and
// commits; call Drop.Observe after the commit to count the drop in the
// metrics.
func (ib *Inbox) DropHeld(ctx context.Context, tx pgx.Tx, eventID uuid.UUID, actor, reason string) (Drop, error) {
	if !storable(actor) || !storable(reason) {
		return Drop{}, errors.New("drop held event: an actor and a reason are required")
	}
	q := inboxdb.New(tx)
	if err := q.InboxRowHashSettings(ctx); err != nil {
		return Drop{}, fmt.Errorf("drop held event %s: %w", eventID, err)
	}
	// The aggregate's lock first, as Process takes it, then the row again:
	// under that lock nothing else changes it.
	var h inboxdb.InboxHeldEvent
	for _, lock := range []bool{false, true} {
		var err error
		if lock {
			if _, err := q.InboxAggregateLock(ctx, inboxdb.InboxAggregateLockParams{AggregateType: h.AggregateType, AggregateID: h.AggregateID}); err != nil {
				return Drop{}, fmt.Errorf("lock inbox aggregate: %w", err)
			}
		}
		h, err = q.InboxHeldGet(ctx, eventID)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && h.State == "rejected") {
			return Drop{}, ErrHeldEventNotFound
		}
		if err != nil {
			return Drop{}, fmt.Errorf("drop held event %s: %w", eventID, err)
		}
	}
	var out Drop
	var err error
	if out.BeforeSHA256, err = q.InboxHeldRowHash(ctx, eventID); err != nil {
		return Drop{}, fmt.Errorf("hash held event: %w", err)
	}
	e := heldEvent(h)
	if err := ib.rejectHeld(ctx, tx, q, e, "dropped by an operator: "+reason, &actor, RejectDropped); err != nil {
		return Drop{}, err
	}
	remaining, err := q.InboxHeldCountForAggregate(ctx, inboxdb.InboxHeldCountForAggregateParams{AggregateType: h.AggregateType, AggregateID: h.AggregateID})
	if err != nil {
		return Drop{}, fmt.Errorf("count held events: %w", err)
	}
	if remaining == 0 {
		if err := q.InboxAggregateCloseGap(ctx, inboxdb.InboxAggregateCloseGapParams{AggregateType: h.AggregateType, AggregateID: h.AggregateID}); err != nil {
			return Drop{}, fmt.Errorf("close gap: %w", err)
		}
	}
	if out.AfterSHA256, err = q.InboxHeldRowHash(ctx, eventID); err != nil {
		return Drop{}, fmt.Errorf("hash held event: %w", err)
	}
	e.Payload = nil
	out.Event = e
	out.Observe = func() { ib.metrics.Rejected.WithLabelValues(RejectDropped).Inc() }
	return out, nil
}

// Drop is what DropHeld did.
type Drop struct {
	// Event is the dropped event, without its payload.
	Event Event
	// BeforeSHA256 and AfterSHA256 hash the held event's row as JSON
	// before and after the drop, for the caller's audit trail.
	BeforeSHA256, AfterSHA256 []byte
	// Observe counts the drop; call it once the transaction committed.
	Observe func()
}

// ParkedEvents lists parked and rejected held events, oldest first.
func ParkedEvents(ctx context.Context, db DBTX, limit int) ([]ParkedEvent, error) {
	rows, err := inboxdb.New(db).InboxHeldParkedList(ctx, int32(max(limit, 1)))
	if err != nil {
		return nil, fmt.Errorf("list parked events: %w", err)
	}
	out := make([]ParkedEvent, 0, len(rows))
	for _, r := range rows {
		out = append(out, ParkedEvent{
			Event: Event{ID: r.EventID, AggregateType: r.AggregateType, AggregateID: r.AggregateID, AggregateVersion: r.AggregateVersion,
				Type: r.EventType, SchemaVersion: int(r.SchemaVersion), Time: r.EventTime},
			Reason: deref(r.ParkReason), Rejected: r.State == "rejected", RejectedBy: deref(r.RejectedBy),
			HeldAt: r.HeldAt, ParkedAt: r.ParkedAt,
		})
	}
	return out, nil
}

// ConflictRecord is an event that claimed an aggregate version another
// event already owned: recorded, never applied (C2).
type ConflictRecord struct {
	// Event is the refused event without its payload.
	Event Event
	// ExistingEventID is the event that owns the version.
	ExistingEventID uuid.UUID
	DetectedAt      time.Time
	// Resolution is the source of truth's verdict: "genuine" (the
	// newcomer was the source's event; its effects ran), "impostor" (it was
	// not), "unverified" (the source could not say), or empty while the
	// conflict waits for a resync.
	Resolution string
	ResolvedAt *time.Time
}

// Conflicts lists recorded conflicts, oldest first.
func Conflicts(ctx context.Context, db DBTX, limit int) ([]ConflictRecord, error) {
	rows, err := inboxdb.New(db).InboxConflictListAll(ctx, int32(max(limit, 1)))
	if err != nil {
		return nil, fmt.Errorf("list conflicts: %w", err)
	}
	out := make([]ConflictRecord, 0, len(rows))
	for _, r := range rows {
		out = append(out, ConflictRecord{
			Event: Event{ID: r.EventID, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
				AggregateVersion: r.AggregateVersion, Type: r.EventType},
			ExistingEventID: r.ExistingEventID, DetectedAt: r.DetectedAt,
			Resolution: deref(r.Resolution), ResolvedAt: r.ResolvedAt,
		})
	}
	return out, nil
}

// DecodeFunc turns a record into an event the way the consumer does: the
// inbox's DecodeRecord and the service's own checks (types, schema
// versions, payload). An error means the record cannot be processed.
type DecodeFunc func(*kgo.Record) (Event, error)

// Retry is what RetryParked did.
type Retry struct {
	// Record is the parked record as it is after the retry.
	Record     ParkedRecord
	Resolution Resolution
	// Result is the inbox's result when it took the event (applied or
	// retried). Pass it to Observe once the transaction has committed.
	Result Result
	// Err is why the record still fails (ResolutionStillFailing).
	Err error
	// BeforeSHA256 and AfterSHA256 hash the record's row as JSON
	// (sha256 of to_jsonb(row)::text, in UTC) before and after the retry,
	// for the caller's audit trail.
	BeforeSHA256, AfterSHA256 []byte
}

// RetryParked retries parked record id in the caller's transaction tx:
// it decodes the stored bytes again with decode and runs the event through
// Process, as the consumer would have, then records on the row what
// happened, by whom (actor) and why (note). The caller commits tx, which
// keeps the retry and whatever it records beside it (an audit row) atomic,
// and then passes Retry.Result to Observe.
//
// A record that still cannot be decoded or processed is not an error: its
// processing is undone (it runs under a savepoint), and the row stays
// parked with the new reason and ResolutionStillFailing. An infrastructure
// failure (IsTransient) is returned as it is, and the caller rolls back.
// The row is locked for the transaction, so concurrent retries of one
// record run one after the other; a record already applied or retried
// returns ErrAlreadyResolved. The transaction's TimeZone and bytea_output
// are set (locally) so that the row hashes do not depend on the session.
func (ib *Inbox) RetryParked(ctx context.Context, tx pgx.Tx, id int64, actor, note string, decode DecodeFunc) (Retry, error) {
	if !storable(actor) {
		return Retry{}, errors.New("retry parked record: an actor (who retries) is required")
	}
	q := inboxdb.New(tx)
	if err := q.InboxRowHashSettings(ctx); err != nil {
		return Retry{}, fmt.Errorf("retry parked record %d: %w", id, err)
	}
	locked, err := q.InboxParkedRecordLock(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Retry{}, fmt.Errorf("retry parked record %d: %w", id, ErrParkedRecordNotFound)
	}
	if err != nil {
		return Retry{}, fmt.Errorf("retry parked record %d: lock: %w", id, err)
	}
	before := parkedRecord(locked.InboxParkedRecord)
	if !before.Open() {
		return Retry{}, fmt.Errorf("retry parked record %d (%s by %s): %w", id, before.Resolution, before.ResolvedBy, ErrAlreadyResolved)
	}
	if err := json.Unmarshal(locked.InboxParkedRecord.Headers, &before.Headers); err != nil {
		return Retry{}, fmt.Errorf("retry parked record %d: headers: %w", id, err)
	}

	out := Retry{BeforeSHA256: locked.RowSha256}
	e, err := decode(before.Record())
	if err == nil {
		err = savepoint(ctx, tx, func(sp pgx.Tx) error {
			res, err := ib.Process(ctx, sp, e)
			out.Result = res
			return err
		})
	}
	var newReason *string
	switch {
	case err != nil && IsTransient(err):
		return Retry{}, fmt.Errorf("retry parked record %d: %w", id, err)
	case err != nil:
		out.Resolution, out.Err, out.Result = ResolutionStillFailing, err, Result{}
		reason := cleanText(err.Error())
		newReason = &reason
	case out.Result.Outcome == Applied || out.Result.Outcome == Covered:
		out.Resolution = ResolutionApplied
	default:
		out.Resolution = ResolutionRetried
	}
	var outcome *string
	if out.Result.Outcome != "" {
		o := string(out.Result.Outcome)
		outcome = &o
	}
	out.AfterSHA256, err = q.InboxParkedRecordResolve(ctx, inboxdb.InboxParkedRecordResolveParams{
		Resolution: string(out.Resolution), RetryOutcome: outcome, NewReason: newReason,
		ResolvedBy: cleanText(actor), Note: cleanText(note), ID: id,
	})
	if err != nil {
		return Retry{}, fmt.Errorf("retry parked record %d: record the resolution: %w", id, err)
	}
	out.Record, err = ParkedRecordByID(ctx, tx, id)
	if err != nil {
		return Retry{}, fmt.Errorf("retry parked record %d: %w", id, err)
	}
	return out, nil
}
