// Package inbox implements the idempotent consumer: it decides, inside the
// consumer's own database transaction, whether an incoming event is new,
// a duplicate, a conflict or early, and only lets a new event in the right
// order reach the business change.
//
// It closes the redelivery window of at-least-once delivery. A broker
// delivers an event again whenever the consumer crashed after its local
// commit but before its offset commit, and a producer may publish the same
// event twice. Because the processed_event marker commits or rolls back
// together with the business change, a copy that arrives later finds the
// marker and changes nothing. Marking in a separate transaction would lose
// the event when the business change fails; acting first and marking
// afterwards would apply it twice after a crash in between.
//
// Ordering is per aggregate: the inbox tracks the last applied version of
// each aggregate, applies the next one, treats older ones as duplicates and
// holds later ones durably until the missing versions arrive. A gap that
// outlives its window is resolved from the source of truth (ResyncDue):
// state continues from the snapshot's version, and events the snapshot
// covers, held or arriving later, are handed to Covered rather than
// applied, so effects that belong to the event itself (a notification) are
// not lost. A different event claiming an already-owned version is a
// conflict: recorded for an operator, counted, never applied on arrival.
// With a source of truth to ask, the aggregate's later versions are held
// and a resync asks the source which event it wrote at that version (its
// Snapshot.Events): if the local history is the source's, the newcomer was
// an impostor and is rejected; if not (the producer's database was
// restored, or an impostor came first), local state is replaced by the
// source's snapshot and the genuine event's effects run once, as for a
// covered event. Only the source's events take a place in the sequence
// (C7): a late event at a version a snapshot placed, and a held event
// beyond every version the source has, are judged by it too, and what the
// source did not write is rejected and kept for an operator.
//
// Payloads are not trusted either: Schemas checks each against the JSON
// Schema its producer publishes, as strict JSON, before the event may take
// a version.
//
// The package knows nothing about the business domain: the service passes
// its business change and effects as functions in Config. It owns its
// migrations, queries and generated code (internal/inboxdb, which Go keeps
// private to the package and no exported name mentions), and imports
// nothing from the service that uses it, so it can be copied into another
// module with one import-path change. Its API, by the side that calls it:
//
// Consuming, in the consumer's transaction:
//   - New, Config, Inbox: one inbox per consumer, with the service's
//     functions: ApplyFunc, BatchApplyFunc, RejectFunc (given RejectConflict,
//     RejectNotFound, RejectImpostor or RejectDropped).
//   - Inbox.Handle (one event, own transaction), Inbox.Process (in the
//     caller's pgx.Tx), Inbox.ProcessBatch (several events in the caller's
//     transaction, set-based when possible; EventError names the event that
//     failed), then Inbox.Observe once the transaction committed.
//   - Event (Event.LogAttrs), Result, Outcome (Applied, Duplicate, Held,
//     Conflict, Covered).
//   - DecodeRecord: the CloudEvents record written by the outbox relay.
//     Schemas, NewSchemas, Schemas.Check and StrictJSON: payloads checked
//     against the producer's JSON Schemas. ErrInvalidEvent, ErrUnknownType
//     and ErrInvalidPayload: why an event can never be processed.
//   - ParkRecord, ParkedHeader: a record that can never be processed, stored
//     losslessly (C6), through a DBTX (a pool or the batch's transaction).
//   - IsTransient: an infrastructure failure, retried rather than parked.
//   - Inbox.Metrics, Metrics (Metrics.InitEventTypes): the Prometheus
//     collectors.
//
// Resynchronising from the source of truth (C3, C7):
//   - Inbox.ResyncDue, run periodically; FetchFunc and SnapshotFunc in
//     Config; Snapshot; ErrNotFound; ResyncOK, ResyncNotFound, ResyncStale
//     and ResyncError (the result label of inbox_resyncs_total).
//
// Operating (O4), for an on-call engineer's API:
//   - ParkedRecords (ParkedListOptions), ParkedRecordByID, ParkedRecord
//     (ParkedRecord.Open, ParkedRecord.Record), ErrParkedRecordNotFound.
//   - Inbox.RetryParked with a DecodeFunc, in the caller's transaction:
//     Retry, Resolution (ResolutionApplied, ResolutionRetried,
//     ResolutionStillFailing), ErrAlreadyResolved.
//   - HeldEvents (HeldEvent), ParkedEvents (ParkedEvent), Conflicts
//     (ConflictRecord).
//   - Inbox.DropHeld, in the caller's transaction: Drop,
//     ErrHeldEventNotFound.
//   - Inbox.RefreshStats, Stats: the counts behind the gauges.
//
// Migrating and upkeep:
//   - Migrations, MigrationLine: the inbox's tables, a goose line of their
//     own.
//   - CheckRetention, ErrRetentionTooShort: the processed_event retention
//     checked at start-up (C5); Inbox.Cleanup deletes expired markers.
package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/orders/internal/inbox/internal/inboxdb"
)

// ErrInvalidEvent is returned for an event that lacks an identity, an
// aggregate or a positive version, or whose text could not be stored. It
// can never be processed, so callers park it rather than retry.
var ErrInvalidEvent = errors.New("inbox: invalid event")

// Event is one integration event as the inbox sees it.
type Event struct {
	// ID is the producer's event_id, the deduplication key.
	ID               uuid.UUID
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	// Type is the event type, for example "invoice.issued".
	Type string
	// Source is the producer's ce_source, as the record carried it (a
	// consumer checks it); it is not stored.
	Source        string
	SchemaVersion int
	// Time is when the producer committed the event.
	Time time.Time
	// Payload is the event body, opaque to the inbox. Held events keep it
	// so they can be applied later, after a restart.
	Payload []byte
	// Traceparent and Tracestate are the W3C trace context the record
	// carried, if any: the context a consumer's spans continue. They are
	// not stored with held events.
	Traceparent string
	Tracestate  string
}

// LogAttrs returns the event's identifiers for structured logs (never the
// payload).
func (e Event) LogAttrs() []any {
	return []any{
		slog.String("event_id", e.ID.String()),
		slog.String("event_type", e.Type),
		slog.String("aggregate_type", e.AggregateType),
		slog.String("aggregate_id", e.AggregateID),
		slog.Int64("aggregate_version", e.AggregateVersion),
	}
}

func (e Event) validate() error {
	switch {
	case e.ID == uuid.Nil:
		return fmt.Errorf("%w: missing event id", ErrInvalidEvent)
	case !storable(e.AggregateType) || !storable(e.AggregateID):
		return fmt.Errorf("%w: missing or unstorable aggregate", ErrInvalidEvent)
	case e.AggregateVersion < 1:
		return fmt.Errorf("%w: aggregate version %d is not positive", ErrInvalidEvent, e.AggregateVersion)
	case !storable(e.Type):
		return fmt.Errorf("%w: missing or unstorable event type", ErrInvalidEvent)
	}
	return nil
}

// storable reports whether s is non-empty text a PostgreSQL text column and
// a log line take as it is: valid UTF-8, no NUL or other control character.
func storable(s string) bool {
	return s != "" && utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0
}

// Outcome is what the inbox did with an event.
type Outcome string

// The outcomes of Process.
const (
	// Applied means the event was the next version and its business change
	// ran in the caller's transaction.
	Applied Outcome = "applied"
	// Duplicate means the event was already accounted for; nothing changed.
	Duplicate Outcome = "duplicate"
	// Held means an earlier version is missing; the event is stored until
	// the gap is filled or resynchronised.
	Held Outcome = "held"
	// Conflict means another event already owns this aggregate version; the
	// event is recorded and never applied.
	Conflict Outcome = "conflict"
	// Covered means a resync snapshot had already placed the event's
	// version: its state change did not run, Covered did.
	Covered Outcome = "covered"
)

// Result reports what Process did.
type Result struct {
	Outcome Outcome
	// Applied lists, in version order, every event whose business change
	// ran in the transaction: the event itself when it was the next version,
	// then any held successors it unblocked.
	Applied []Event
	// Parked lists held successors that failed when their turn came and
	// were parked on their own (with the reason), instead of failing the
	// event that released them.
	Parked []Event
	// ExistingEventID is, for a conflict, the event that owns the version.
	ExistingEventID uuid.UUID
	// Diverged is set when the aggregate's history forked from the
	// producer's (an earlier conflict): a later version is held until a
	// resync from the source of truth, never applied on top.
	Diverged bool
	// LastVersion is the aggregate's applied version after processing.
	LastVersion int64

	event Event
}

// ApplyFunc performs a change for one event inside tx. An error rolls back
// the whole transaction, the inbox marker included.
type ApplyFunc func(ctx context.Context, tx pgx.Tx, e Event) error

// RejectFunc records, inside tx, that an event will never be applied and
// why ("conflict", "not_found"), so that effects owed to it can be
// accounted for (for example, a notification recorded as skipped).
type RejectFunc func(ctx context.Context, tx pgx.Tx, e Event, reason string) error

// Reasons passed to RejectFunc.
const (
	RejectConflict = "conflict"  // another event owns the version, and no source of truth could say which is real
	RejectNotFound = "not_found" // the source of truth does not know the aggregate
	// RejectImpostor: the source of truth owns another event at the
	// version, or no event at all (the version is beyond any it has).
	RejectImpostor = "impostor"
	// RejectDropped: an operator dropped the held event (DropHeld).
	RejectDropped = "dropped"
)

// DBTX is where the inbox's standalone functions (ParkRecord and the
// operators' reads) run their statements: a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx, all of which have these methods. Pass a transaction to make the
// call part of the caller's own writes (a record parked in the same
// transaction as its batch), a pool otherwise. The methods are pgx's own,
// so the inbox's public API names no generated code.
type DBTX interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures an Inbox.
type Config struct {
	// Pool is the consumer's database, holding the inbox tables.
	Pool *pgxpool.Pool
	// Apply is the business change of an event whose turn has come.
	Apply ApplyFunc
	// ApplyBatch, if set, is Apply for several events at once, and lets
	// ProcessBatch take its set-based path. It must have the same effect
	// as Apply called for each event in order. Nil means ProcessBatch
	// processes event by event.
	ApplyBatch BatchApplyFunc
	// Covered, if set, runs for an event whose version a resync snapshot
	// already placed (a held event the snapshot covered, or a late event
	// arriving after it). State must not change, since the snapshot holds
	// it; effects that belong to the event itself may run. Nil means such
	// events are only recorded.
	Covered ApplyFunc
	// Rejected, if set, runs for an event that will never be applied.
	Rejected RejectFunc

	// Fetch and ApplySnapshot resolve a gap that outlived GapWindow from
	// the source of truth (ResyncDue). Nil Fetch means gaps are held until
	// the missing versions arrive.
	Fetch         FetchFunc
	ApplySnapshot SnapshotFunc
	// GapWindow is how long an aggregate may wait for a missing version
	// before it is resynchronised.
	GapWindow time.Duration
	// ResyncRetry is the wait before another resync attempt after one
	// failed or returned a snapshot that was not ahead of local state.
	// GapWindow when zero.
	ResyncRetry time.Duration

	// Registerer receives the inbox metrics; nil means a private registry.
	Registerer prometheus.Registerer
	// Logger receives conflict, gap and resync logs; nil means slog.Default.
	Logger *slog.Logger
}

// Inbox processes events for one consumer. It is safe for concurrent use:
// all coordination happens in the database.
type Inbox struct {
	cfg     Config
	metrics *Metrics
	log     *slog.Logger
}

// New checks cfg and registers the inbox's metrics.
func New(cfg Config) (*Inbox, error) {
	switch {
	case cfg.Pool == nil:
		return nil, errors.New("inbox: Pool is required")
	case cfg.Apply == nil:
		return nil, errors.New("inbox: Apply is required")
	case cfg.GapWindow <= 0:
		return nil, errors.New("inbox: GapWindow must be positive")
	case cfg.Fetch != nil && cfg.ApplySnapshot == nil:
		return nil, errors.New("inbox: Fetch needs ApplySnapshot")
	}
	if cfg.ResyncRetry <= 0 {
		cfg.ResyncRetry = cfg.GapWindow
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Inbox{cfg: cfg, metrics: m, log: cfg.Logger}, nil
}

// Metrics returns the inbox's metric collectors, for example to
// pre-initialise label values for known event types.
func (ib *Inbox) Metrics() *Metrics { return ib.metrics }

// Handle processes e in a transaction of its own and, once that transaction
// has committed, counts the result in the metrics. It is the usual entry
// point; use Process to join a transaction you already hold.
func (ib *Inbox) Handle(ctx context.Context, e Event) (res Result, err error) {
	err = pgx.BeginFunc(ctx, ib.cfg.Pool, func(tx pgx.Tx) error {
		res, err = ib.Process(ctx, tx, e)
		return err
	})
	if err != nil {
		return Result{}, err
	}
	ib.Observe(res)
	return res, nil
}

// Process records e in the caller's transaction tx and applies it, and any
// held successors, when its turn has come. Nothing it writes survives a
// rollback of tx, so a failure anywhere in the business change leaves the
// event unprocessed and a redelivery processes it normally.
//
// Process may be called for several events in one transaction (a consumer
// applying a batch of records): it keeps no state between calls and reads
// everything through tx, so each call sees the writes of the earlier ones
// and the outcomes are those of one transaction per event, applied in
// call order. The batch then commits or rolls back as a whole.
//
// Call Observe with the result after tx commits: counting before the commit
// would count work that may still roll back.
func (ib *Inbox) Process(ctx context.Context, tx pgx.Tx, e Event) (Result, error) {
	if err := e.validate(); err != nil {
		return Result{}, err
	}
	q := inboxdb.New(tx)
	if err := q.InboxAggregateEnsure(ctx, inboxdb.InboxAggregateEnsureParams{AggregateType: e.AggregateType, AggregateID: e.AggregateID}); err != nil {
		return Result{}, fmt.Errorf("ensure inbox aggregate: %w", err)
	}
	agg, err := q.InboxAggregateLock(ctx, inboxdb.InboxAggregateLockParams{AggregateType: e.AggregateType, AggregateID: e.AggregateID})
	if err != nil {
		return Result{}, fmt.Errorf("lock inbox aggregate: %w", err)
	}
	res := Result{LastVersion: agg.LastVersion, event: e}
	v, last := e.AggregateVersion, agg.LastVersion
	// A conflict showed that the producer's history of this aggregate forked
	// from the one applied here: its later versions wait for the resync
	// instead of landing on top of the lost history.
	res.Diverged = agg.DivergedAt != nil

	switch {
	case v <= last:
		owner, err := q.ProcessedEventOwner(ctx, inboxdb.ProcessedEventOwnerParams{
			AggregateType: e.AggregateType, AggregateID: e.AggregateID, AggregateVersion: v,
		})
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return Result{}, fmt.Errorf("look up version owner: %w", err)
		}
		if err == nil {
			if owner != e.ID {
				return ib.conflict(ctx, tx, q, e, owner, res)
			}
			res.Outcome = Duplicate
			return res, nil
		}
		// Nobody owns the version although state is past it: a resync
		// snapshot placed it before this event arrived. (A marker deleted
		// by the TTL cleanup looks the same; the retention check keeps that
		// from happening within the redelivery window.)
		if ib.cfg.Fetch != nil {
			// Nothing in local state can vouch for the event any more, and
			// its effects are still to run: it is held, and the source of
			// truth is asked at once whether it wrote it (C7). Another event
			// already waiting at the version makes it a conflict, which the
			// source settles the same way.
			return ib.hold(ctx, tx, q, e, res, true)
		}
		fresh, err := insertMarker(ctx, q, e, "covered")
		if err != nil {
			return Result{}, err
		}
		if !fresh {
			res.Outcome = Duplicate // seen before, as a conflict or parked
			return res, nil
		}
		if ib.cfg.Covered != nil {
			if err := ib.cfg.Covered(ctx, tx, e); err != nil {
				return Result{}, fmt.Errorf("covered %s v%d: %w", e.Type, v, err)
			}
		}
		res.Outcome = Covered
		return res, nil

	case v == last+1 && !res.Diverged:
		// A parked held event (a resync answered 404, or its change failed)
		// still owns its version: a different event claiming it is a
		// conflict to surface, not the next version to apply.
		if held, err := q.InboxHeldGetByVersion(ctx, inboxdb.InboxHeldGetByVersionParams{
			AggregateType: e.AggregateType, AggregateID: e.AggregateID, AggregateVersion: v,
		}); err == nil && held.EventID != e.ID {
			return ib.conflict(ctx, tx, q, e, held.EventID, res)
		} else if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return Result{}, fmt.Errorf("look up held version: %w", err)
		}
		fresh, err := insertMarker(ctx, q, e, "applied")
		if err != nil {
			return Result{}, err
		}
		if !fresh {
			res.Outcome = Duplicate
			return res, nil
		}
		if err := ib.applyOne(ctx, tx, q, e); err != nil {
			return Result{}, err
		}
		res.Outcome = Applied
		res.Applied = append(res.Applied, e)
		drained, parked, last, err := ib.drain(ctx, tx, q, e.AggregateType, e.AggregateID, v)
		if err != nil {
			return Result{}, err
		}
		res.Applied = append(res.Applied, drained...)
		res.Parked = parked
		res.LastVersion = last
		return res, nil

	default: // a gap (versions last+1 .. v-1 are missing), or a diverged aggregate
		return ib.hold(ctx, tx, q, e, res, false)
	}
}

// hold stores e until its turn comes and starts the gap clock, or, with
// now, makes a resync due at once. Another event already waiting at e's
// version makes e a conflict; the same event again is a duplicate.
func (ib *Inbox) hold(ctx context.Context, tx pgx.Tx, q *inboxdb.Queries, e Event, res Result, now bool) (Result, error) {
	held, err := q.InboxHeldGetByVersion(ctx, inboxdb.InboxHeldGetByVersionParams{
		AggregateType: e.AggregateType, AggregateID: e.AggregateID, AggregateVersion: e.AggregateVersion,
	})
	switch {
	case err == nil && held.EventID == e.ID:
		res.Outcome = Duplicate
		return res, nil
	case err == nil:
		return ib.conflict(ctx, tx, q, e, held.EventID, res)
	case !errors.Is(err, pgx.ErrNoRows):
		return Result{}, fmt.Errorf("look up held version: %w", err)
	}
	fresh, err := insertMarker(ctx, q, e, "held")
	if err != nil {
		return Result{}, err
	}
	if !fresh {
		res.Outcome = Duplicate
		return res, nil
	}
	if err := q.InboxHeldInsert(ctx, inboxdb.InboxHeldInsertParams{
		EventID: e.ID, AggregateType: e.AggregateType, AggregateID: e.AggregateID,
		AggregateVersion: e.AggregateVersion, EventType: e.Type, SchemaVersion: int32(e.SchemaVersion),
		EventTime: e.Time, Payload: e.Payload,
	}); err != nil {
		return Result{}, fmt.Errorf("hold event: %w", err)
	}
	if now {
		err = q.InboxAggregateResyncNow(ctx, inboxdb.InboxAggregateResyncNowParams{AggregateType: e.AggregateType, AggregateID: e.AggregateID})
	} else {
		err = q.InboxAggregateOpenGap(ctx, inboxdb.InboxAggregateOpenGapParams{
			WindowSeconds: ib.cfg.GapWindow.Seconds(), AggregateType: e.AggregateType, AggregateID: e.AggregateID,
		})
	}
	if err != nil {
		return Result{}, fmt.Errorf("open gap: %w", err)
	}
	res.Outcome = Held
	return res, nil
}

// Observe counts a committed result in the metrics and logs what an
// operator must see (conflicts, gaps, parked events).
func (ib *Inbox) Observe(r Result) {
	e := r.event
	switch r.Outcome {
	case Duplicate:
		ib.metrics.Duplicates.WithLabelValues(e.Type).Inc()
	case Conflict:
		ib.metrics.Conflicts.WithLabelValues(e.Type).Inc()
		msg := "inbox conflict: another event owns this aggregate version; recorded, not applied"
		if r.Diverged {
			msg += "; the aggregate is resynchronised from the source of truth, its later versions held until then"
		}
		ib.log.Warn(msg, append(e.LogAttrs(), slog.String("existing_event_id", r.ExistingEventID.String()))...)
	case Held:
		ib.metrics.Gaps.WithLabelValues(e.Type).Inc()
		msg := "inbox gap: event held until the missing versions arrive"
		if r.Diverged {
			msg = "inbox: event held: its aggregate's history forked from the producer's (a conflict); it waits for the resync from the source of truth"
		}
		ib.log.Info(msg, append(e.LogAttrs(), slog.Int64("last_applied_version", r.LastVersion))...)
	case Covered:
		ib.metrics.Covered.WithLabelValues(e.Type).Inc()
		ib.log.Info("inbox: event arrived after a resync snapshot covered its version; its state change is skipped",
			append(e.LogAttrs(), slog.Int64("last_applied_version", r.LastVersion))...)
	}
	for _, p := range r.Parked {
		ib.log.Error("inbox: held event failed when its turn came; parked for an operator", p.LogAttrs()...)
	}
}

func (ib *Inbox) conflict(ctx context.Context, tx pgx.Tx, q *inboxdb.Queries, e Event, owner uuid.UUID, res Result) (Result, error) {
	fresh, err := insertMarker(ctx, q, e, "conflict")
	if err != nil {
		return Result{}, err
	}
	if !fresh {
		// This very event was seen before (as this conflict): a redelivery.
		res.Outcome = Duplicate
		return res, nil
	}
	sv := int32(e.SchemaVersion)
	if err := q.InboxConflictInsert(ctx, inboxdb.InboxConflictInsertParams{
		EventID: e.ID, AggregateType: e.AggregateType, AggregateID: e.AggregateID,
		AggregateVersion: e.AggregateVersion, EventType: e.Type, ExistingEventID: owner, Payload: e.Payload,
		SchemaVersion: &sv, EventTime: &e.Time,
	}); err != nil {
		return Result{}, fmt.Errorf("record conflict: %w", err)
	}
	// Without a source of truth to ask, the event that came first keeps the
	// version and the newcomer is refused now. With one, neither is
	// trusted on arrival order alone: a record written by anyone who can
	// produce to the topic could have come first. The resync asks the
	// source which event_id it wrote at this version; the genuine event's
	// effects then run once, and the impostor is rejected (C7).
	if ib.cfg.Fetch == nil && ib.cfg.Rejected != nil {
		if err := ib.cfg.Rejected(ctx, tx, e, RejectConflict); err != nil {
			return Result{}, fmt.Errorf("reject conflicting %s v%d: %w", e.Type, e.AggregateVersion, err)
		}
	}
	// Two events for one version: the producer's history forked from the
	// one applied here, or one of them is not the producer's. With a source
	// of truth to ask, the aggregate is resynchronised from it at once;
	// until then its later versions are held.
	if ib.cfg.Fetch != nil {
		if err := q.InboxAggregateDiverge(ctx, inboxdb.InboxAggregateDivergeParams{
			Version: e.AggregateVersion, AggregateType: e.AggregateType, AggregateID: e.AggregateID,
		}); err != nil {
			return Result{}, fmt.Errorf("mark diverged: %w", err)
		}
		res.Diverged = true
	}
	res.Outcome = Conflict
	res.ExistingEventID = owner
	return res, nil
}

// applyOne runs the business change and then moves the version forward. The
// guarded update doubles as an assertion: the aggregate row is locked, so
// it can only fail if the caller broke the ordering invariant.
func (ib *Inbox) applyOne(ctx context.Context, tx pgx.Tx, q *inboxdb.Queries, e Event) error {
	if err := ib.cfg.Apply(ctx, tx, e); err != nil {
		return fmt.Errorf("apply %s v%d: %w", e.Type, e.AggregateVersion, err)
	}
	n, err := q.InboxAggregateAdvance(ctx, inboxdb.InboxAggregateAdvanceParams{
		NewVersion: e.AggregateVersion, AggregateType: e.AggregateType, AggregateID: e.AggregateID,
	})
	if err != nil {
		return fmt.Errorf("advance aggregate version: %w", err)
	}
	if n != 1 {
		return fmt.Errorf("advance %s/%s to v%d: version did not move forward", e.AggregateType, e.AggregateID, e.AggregateVersion)
	}
	return nil
}

// drain applies held events that directly follow version from, in order,
// and closes the gap once nothing is held any more.
//
// Each held event runs under a savepoint. One whose change fails for a
// reason other than the infrastructure (a payload its consumer now refuses,
// a bug) is parked on its own with the reason and draining stops there: the
// event that released it, and the rest of the transaction, still commit.
// Later versions stay held behind it, and the gap stays open, so a resync
// resolves them in time.
func (ib *Inbox) drain(ctx context.Context, tx pgx.Tx, q *inboxdb.Queries, aggType, aggID string, from int64) (applied, parked []Event, last int64, err error) {
	last = from
	for {
		h, err := q.InboxHeldNext(ctx, inboxdb.InboxHeldNextParams{AggregateType: aggType, AggregateID: aggID, AggregateVersion: last + 1})
		if errors.Is(err, pgx.ErrNoRows) {
			break
		}
		if err != nil {
			return nil, nil, 0, fmt.Errorf("read held successor: %w", err)
		}
		e := heldEvent(h)
		err = savepoint(ctx, tx, func(sp pgx.Tx) error {
			sq := inboxdb.New(sp)
			if err := sq.InboxHeldDelete(ctx, h.EventID); err != nil {
				return fmt.Errorf("release held event: %w", err)
			}
			if err := sq.ProcessedEventSetOutcome(ctx, inboxdb.ProcessedEventSetOutcomeParams{EventID: h.EventID, Outcome: "applied"}); err != nil {
				return fmt.Errorf("mark held event applied: %w", err)
			}
			return ib.applyOne(ctx, sp, sq, e)
		})
		if err != nil {
			if IsTransient(err) {
				return nil, nil, 0, err
			}
			if perr := parkHeld(ctx, q, e, err); perr != nil {
				return nil, nil, 0, perr
			}
			parked = append(parked, e)
			break
		}
		applied = append(applied, e)
		last = e.AggregateVersion
	}
	remaining, err := q.InboxHeldCountForAggregate(ctx, inboxdb.InboxHeldCountForAggregateParams{AggregateType: aggType, AggregateID: aggID})
	if err != nil {
		return nil, nil, 0, fmt.Errorf("count held events: %w", err)
	}
	if remaining == 0 {
		if err := q.InboxAggregateCloseGap(ctx, inboxdb.InboxAggregateCloseGapParams{AggregateType: aggType, AggregateID: aggID}); err != nil {
			return nil, nil, 0, fmt.Errorf("close gap: %w", err)
		}
	}
	return applied, parked, last, nil
}

// parkHeld parks one held event whose change failed, with the reason.
func parkHeld(ctx context.Context, q *inboxdb.Queries, e Event, cause error) error {
	if _, err := q.InboxHeldParkOne(ctx, inboxdb.InboxHeldParkOneParams{EventID: e.ID, Reason: cleanText(cause.Error())}); err != nil {
		return fmt.Errorf("park held event: %w", err)
	}
	if err := q.ProcessedEventSetOutcome(ctx, inboxdb.ProcessedEventSetOutcomeParams{EventID: e.ID, Outcome: "parked"}); err != nil {
		return fmt.Errorf("mark held event parked: %w", err)
	}
	return nil
}

// savepoint runs fn in a nested transaction (a SAVEPOINT of tx): when fn
// fails, only its own writes are undone and tx stays usable.
func savepoint(ctx context.Context, tx pgx.Tx, fn func(pgx.Tx) error) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	if err := fn(sp); err != nil {
		if rerr := sp.Rollback(ctx); rerr != nil {
			return errors.Join(err, fmt.Errorf("roll back to savepoint: %w", rerr))
		}
		return err
	}
	if err := sp.Commit(ctx); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

func insertMarker(ctx context.Context, q *inboxdb.Queries, e Event, outcome string) (fresh bool, err error) {
	_, err = q.ProcessedEventInsert(ctx, inboxdb.ProcessedEventInsertParams{
		EventID: e.ID, AggregateType: e.AggregateType, AggregateID: e.AggregateID,
		AggregateVersion: e.AggregateVersion, EventType: e.Type, Outcome: outcome,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("insert processed_event: %w", err)
	}
	return true, nil
}

func heldEvent(h inboxdb.InboxHeldEvent) Event {
	return Event{
		ID: h.EventID, AggregateType: h.AggregateType, AggregateID: h.AggregateID,
		AggregateVersion: h.AggregateVersion, Type: h.EventType, SchemaVersion: int(h.SchemaVersion),
		Time: h.EventTime, Payload: h.Payload,
	}
}
