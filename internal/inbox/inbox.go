// Package inbox implements the idempotent consumer: it decides, inside the
// consumer's own database transaction, whether an incoming event is new,
// a duplicate, a conflict or early, and only lets a new event in the right
// order reach the business change.
//
// It closes the redelivery window of at-least-once delivery. A broker
// delivers an event again whenever the consumer crashed after its local
// commit but before its offset commit, and a producer may publish the same
// event twice (R3). Because the processed_event marker commits or rolls back
// together with the business change (C2, V4), a copy that arrives later
// finds the marker and changes nothing. Marking in a separate transaction
// would lose the event when the business change fails; acting first and
// marking afterwards would apply it twice after a crash in between.
//
// Ordering is per aggregate (C3): the inbox tracks the last applied version
// of each aggregate, applies the next one, treats older ones as duplicates
// and holds later ones durably until the missing versions arrive. A gap
// that outlives its window is resolved from the source of truth (Resync).
// A different event claiming an already-owned version is a conflict: it is
// recorded for an operator, counted, and never applied.
//
// The package knows nothing about the business domain: callers pass the
// business change as an ApplyFunc.
package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/orders/internal/inbox/inboxdb"
)

// ErrInvalidEvent is returned for an event that lacks an identity, an
// aggregate or a positive version. It can never be processed, so callers
// park it rather than retry.
var ErrInvalidEvent = errors.New("inbox: invalid event")

// Event is one integration event as the inbox sees it.
type Event struct {
	// ID is the producer's event_id, the deduplication key.
	ID               uuid.UUID
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	// Type is the event type, for example "order.placed".
	Type          string
	SchemaVersion int
	// Time is when the producer committed the event.
	Time time.Time
	// Payload is the event body, opaque to the inbox. Held events keep it
	// so they can be applied later, after a restart.
	Payload []byte
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
	case e.AggregateType == "" || e.AggregateID == "":
		return fmt.Errorf("%w: missing aggregate", ErrInvalidEvent)
	case e.AggregateVersion < 1:
		return fmt.Errorf("%w: aggregate version %d is not positive", ErrInvalidEvent, e.AggregateVersion)
	case e.Type == "":
		return fmt.Errorf("%w: missing event type", ErrInvalidEvent)
	}
	return nil
}

// Outcome is what the inbox did with an event.
type Outcome string

// The outcomes of Process.
const (
	// Applied means the event was the next version and its business change
	// ran in the caller's transaction.
	Applied Outcome = "applied"
	// Duplicate means the event (or its version) was already accounted for;
	// nothing changed.
	Duplicate Outcome = "duplicate"
	// Held means an earlier version is missing; the event is stored until
	// the gap is filled or resynchronised.
	Held Outcome = "held"
	// Conflict means another event already owns this aggregate version; the
	// event is recorded and never applied.
	Conflict Outcome = "conflict"
)

// Result reports what Process did.
type Result struct {
	Outcome Outcome
	// Applied lists, in version order, every event whose business change
	// ran in the transaction: the event itself when it was the next version,
	// then any held successors it unblocked.
	Applied []Event
	// ExistingEventID is, for a conflict, the event that owns the version.
	ExistingEventID uuid.UUID
	// LastVersion is the aggregate's applied version after processing.
	LastVersion int64

	event Event
}

// ApplyFunc performs the business change for one event inside tx. An error
// rolls back the whole transaction, the inbox marker included.
type ApplyFunc func(ctx context.Context, tx pgx.Tx, e Event) error

// Config configures an Inbox.
type Config struct {
	// GapWindow is how long an aggregate may wait for a missing version
	// before it is resynchronised from the source of truth.
	GapWindow time.Duration
	// ResyncRetry is the wait before another resync attempt after one
	// failed or returned a snapshot that was not ahead of local state.
	ResyncRetry time.Duration
	// Registerer receives the inbox metrics; nil means a private registry.
	Registerer prometheus.Registerer
	// Logger receives conflict, gap and resync logs; nil means slog.Default.
	Logger *slog.Logger
}

// Inbox processes events for one consumer. It is safe for concurrent use:
// all coordination happens in the database.
type Inbox struct {
	gapWindow   time.Duration
	resyncRetry time.Duration
	metrics     *Metrics
	log         *slog.Logger
}

// New returns an Inbox and registers its metrics.
func New(cfg Config) (*Inbox, error) {
	if cfg.GapWindow <= 0 {
		return nil, errors.New("inbox: gap window must be positive")
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
	return &Inbox{gapWindow: cfg.GapWindow, resyncRetry: cfg.ResyncRetry, metrics: m, log: cfg.Logger}, nil
}

// Metrics returns the inbox's metric collectors, for example to
// pre-initialise label values for known event types.
func (ib *Inbox) Metrics() *Metrics { return ib.metrics }

// Handle processes e in a transaction of its own on pool and, once that
// transaction has committed, counts the result in the metrics. It is the
// usual entry point; use Process to join a transaction you already hold.
func (ib *Inbox) Handle(ctx context.Context, pool *pgxpool.Pool, e Event, apply ApplyFunc) (res Result, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err = ib.Process(ctx, tx, e, apply)
		return err
	})
	if err != nil {
		return Result{}, err
	}
	ib.Observe(res)
	return res, nil
}

// Process records e in the caller's transaction tx and applies it, and any
// held successors, through apply when its turn has come. Nothing it writes
// survives a rollback of tx, so a failure anywhere in the business change
// leaves the event unprocessed and a redelivery processes it normally.
//
// Process may be called for several events in one transaction (a consumer
// applying a batch of records): it keeps no state between calls and reads
// everything through tx, so each call sees the writes of the earlier ones
// and the outcomes are those of one transaction per event, applied in
// call order. The batch then commits or rolls back as a whole.
//
// Call Observe with the result after tx commits: counting before the commit
// would count work that may still roll back.
func (ib *Inbox) Process(ctx context.Context, tx pgx.Tx, e Event, apply ApplyFunc) (Result, error) {
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

	switch {
	case v <= last:
		owner, err := q.ProcessedEventOwner(ctx, inboxdb.ProcessedEventOwnerParams{
			AggregateType: e.AggregateType, AggregateID: e.AggregateID, AggregateVersion: v,
		})
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return Result{}, fmt.Errorf("look up version owner: %w", err)
		}
		if err == nil && owner != e.ID {
			return ib.conflict(ctx, q, e, owner, res)
		}
		// Same event again, or a version a snapshot covered (or whose
		// marker has expired): at or below the applied version either way.
		res.Outcome = Duplicate
		return res, nil

	case v == last+1:
		// A parked held event (a resync answered 404) still owns its
		// version: a different event claiming it is a conflict to surface,
		// not the next version to apply.
		if held, err := q.InboxHeldGetByVersion(ctx, inboxdb.InboxHeldGetByVersionParams{
			AggregateType: e.AggregateType, AggregateID: e.AggregateID, AggregateVersion: v,
		}); err == nil && held.EventID != e.ID {
			return ib.conflict(ctx, q, e, held.EventID, res)
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
		if err := ib.applyOne(ctx, tx, q, e, apply); err != nil {
			return Result{}, err
		}
		res.Outcome = Applied
		res.Applied = append(res.Applied, e)
		drained, last, err := ib.drain(ctx, tx, q, e.AggregateType, e.AggregateID, v, apply)
		if err != nil {
			return Result{}, err
		}
		res.Applied = append(res.Applied, drained...)
		res.LastVersion = last
		return res, nil

	default: // a gap: versions last+1 .. v-1 are missing
		held, err := q.InboxHeldGetByVersion(ctx, inboxdb.InboxHeldGetByVersionParams{
			AggregateType: e.AggregateType, AggregateID: e.AggregateID, AggregateVersion: v,
		})
		switch {
		case err == nil && held.EventID == e.ID:
			res.Outcome = Duplicate
			return res, nil
		case err == nil:
			return ib.conflict(ctx, q, e, held.EventID, res)
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
			AggregateVersion: v, EventType: e.Type, SchemaVersion: int32(e.SchemaVersion),
			EventTime: e.Time, Payload: e.Payload,
		}); err != nil {
			return Result{}, fmt.Errorf("hold event: %w", err)
		}
		if err := q.InboxAggregateOpenGap(ctx, inboxdb.InboxAggregateOpenGapParams{
			WindowSeconds: ib.gapWindow.Seconds(), AggregateType: e.AggregateType, AggregateID: e.AggregateID,
		}); err != nil {
			return Result{}, fmt.Errorf("open gap: %w", err)
		}
		res.Outcome = Held
		return res, nil
	}
}

// Observe counts a committed result in the metrics and logs what an
// operator must see (conflicts, gaps).
func (ib *Inbox) Observe(r Result) {
	e := r.event
	switch r.Outcome {
	case Duplicate:
		ib.metrics.Duplicates.WithLabelValues(e.Type).Inc()
	case Conflict:
		ib.metrics.Conflicts.WithLabelValues(e.Type).Inc()
		ib.log.Warn("inbox conflict: another event owns this aggregate version; recorded, not applied",
			append(e.LogAttrs(), slog.String("existing_event_id", r.ExistingEventID.String()))...)
	case Held:
		ib.metrics.Gaps.WithLabelValues(e.Type).Inc()
		ib.log.Info("inbox gap: event held until the missing versions arrive",
			append(e.LogAttrs(), slog.Int64("last_applied_version", r.LastVersion))...)
	}
}

func (ib *Inbox) conflict(ctx context.Context, q *inboxdb.Queries, e Event, owner uuid.UUID, res Result) (Result, error) {
	fresh, err := insertMarker(ctx, q, e, "conflict")
	if err != nil {
		return Result{}, err
	}
	if !fresh {
		// This very event was seen before (as this conflict): a redelivery.
		res.Outcome = Duplicate
		return res, nil
	}
	if err := q.InboxConflictInsert(ctx, inboxdb.InboxConflictInsertParams{
		EventID: e.ID, AggregateType: e.AggregateType, AggregateID: e.AggregateID,
		AggregateVersion: e.AggregateVersion, EventType: e.Type, ExistingEventID: owner, Payload: e.Payload,
	}); err != nil {
		return Result{}, fmt.Errorf("record conflict: %w", err)
	}
	res.Outcome = Conflict
	res.ExistingEventID = owner
	return res, nil
}

// applyOne runs the business change and then moves the version forward. The
// guarded update doubles as an assertion: the aggregate row is locked, so
// it can only fail if the caller broke the ordering invariant.
func (ib *Inbox) applyOne(ctx context.Context, tx pgx.Tx, q *inboxdb.Queries, e Event, apply ApplyFunc) error {
	if err := apply(ctx, tx, e); err != nil {
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
func (ib *Inbox) drain(ctx context.Context, tx pgx.Tx, q *inboxdb.Queries, aggType, aggID string, from int64, apply ApplyFunc) ([]Event, int64, error) {
	var applied []Event
	last := from
	for {
		h, err := q.InboxHeldNext(ctx, inboxdb.InboxHeldNextParams{AggregateType: aggType, AggregateID: aggID, AggregateVersion: last + 1})
		if errors.Is(err, pgx.ErrNoRows) {
			break
		}
		if err != nil {
			return nil, 0, fmt.Errorf("read held successor: %w", err)
		}
		e := heldEvent(h)
		if err := q.InboxHeldDelete(ctx, h.EventID); err != nil {
			return nil, 0, fmt.Errorf("release held event: %w", err)
		}
		if err := q.ProcessedEventSetOutcome(ctx, inboxdb.ProcessedEventSetOutcomeParams{EventID: h.EventID, Outcome: "applied"}); err != nil {
			return nil, 0, fmt.Errorf("mark held event applied: %w", err)
		}
		if err := ib.applyOne(ctx, tx, q, e, apply); err != nil {
			return nil, 0, err
		}
		applied = append(applied, e)
		last = e.AggregateVersion
	}
	remaining, err := q.InboxHeldCountForAggregate(ctx, inboxdb.InboxHeldCountForAggregateParams{AggregateType: aggType, AggregateID: aggID})
	if err != nil {
		return nil, 0, fmt.Errorf("count held events: %w", err)
	}
	if remaining == 0 {
		if err := q.InboxAggregateCloseGap(ctx, inboxdb.InboxAggregateCloseGapParams{AggregateType: aggType, AggregateID: aggID}); err != nil {
			return nil, 0, fmt.Errorf("close gap: %w", err)
		}
	}
	return applied, last, nil
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
