package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/orders/internal/inbox/internal/inboxdb"
)

// ErrNotFound is returned by a FetchFunc when the source of truth does not
// know the aggregate. The held events are then parked with that reason.
var ErrNotFound = errors.New("inbox: aggregate not found at the source of truth")

// Resync results, as the result label of inbox_resyncs_total.
const (
	ResyncOK       = "resynced"
	ResyncNotFound = "not_found"
	ResyncStale    = "stale"
	ResyncError    = "error"
)

// Snapshot is the source of truth's current state of one aggregate.
type Snapshot struct {
	AggregateType string
	AggregateID   string
	// Version is the aggregate version the snapshot reflects. Local state
	// continues from it.
	Version int64
	// State is the domain's representation, passed to ApplySnapshot.
	State any
	// Events, when the source can tell, maps each version of the aggregate
	// to the event_id the source wrote at it (at least every version up to
	// Version). The inbox then admits only those events: a held event or a
	// conflicting newcomer whose id is not the source's at its version is
	// rejected (RejectImpostor), and the genuine side of a conflict has its
	// effects run once. Nil means the source cannot tell, and the inbox
	// trusts the arrival order as far as versions allow.
	Events map[int64]uuid.UUID
	// Rebase is set by the inbox, for ApplySnapshot, when the aggregate's
	// history forked from the source's (a conflict): the snapshot then
	// replaces local state even if its version is not ahead of it, since
	// the local state belongs to a history the source no longer has.
	// Otherwise a snapshot is always ahead of local state.
	Rebase bool
}

// FetchFunc reads an aggregate from the source of truth. It runs outside
// any transaction (no lock is held across the network call) and returns
// ErrNotFound when the aggregate does not exist there.
type FetchFunc func(ctx context.Context, aggregateType, aggregateID string) (Snapshot, error)

// SnapshotFunc replaces the local state of the aggregate inside tx.
type SnapshotFunc func(ctx context.Context, tx pgx.Tx, s Snapshot) error

// ResyncDue resolves up to limit aggregates whose gap outlived the window,
// or whose events' place is in doubt (a conflict, a late event at a placed
// version): it alerts (log and the inbox_gaps_overdue gauge), fetches a
// snapshot, continues from the snapshot's version and applies the held
// events that still follow it. Held events the snapshot covers are handed
// to Covered (their own effects still happen), never applied: local state
// never moves backwards. With the source's event ids (Snapshot.Events),
// only its own events are covered or applied; the others, and held events
// beyond every version the source has, are rejected (C7). A failed fetch,
// or a snapshot of a forked aggregate that has not reached the fork yet,
// is retried after ResyncRetry. It returns the events whose Apply or
// Covered ran, for callers that react to new work.
func (ib *Inbox) ResyncDue(ctx context.Context, limit int) ([]Event, error) {
	if ib.cfg.Fetch == nil {
		return nil, nil
	}
	due, err := inboxdb.New(ib.cfg.Pool).InboxGapsDue(ctx, int32(limit))
	if err != nil {
		return nil, fmt.Errorf("list overdue gaps: %w", err)
	}
	var done []Event
	var errs []error
	for _, agg := range due {
		evs, err := ib.resyncOne(ctx, agg)
		done = append(done, evs...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return done, errors.Join(errs...)
}

func (ib *Inbox) resyncOne(ctx context.Context, agg inboxdb.InboxAggregate) ([]Event, error) {
	log := ib.log.With(slog.String("aggregate_type", agg.AggregateType), slog.String("aggregate_id", agg.AggregateID),
		slog.Int64("last_applied_version", agg.LastVersion))
	var waited time.Duration
	if agg.GapSince != nil {
		waited = time.Since(*agg.GapSince).Round(time.Millisecond)
	}
	log.Warn("inbox gap outlived its window: resynchronising from the source of truth",
		slog.Duration("gap_age", waited), slog.Int("resync_attempts", int(agg.ResyncAttempts)))

	// The events held when the source is asked: only these can be judged
	// by its answer. One held after it may be of a version the source wrote
	// after the snapshot was read.
	before, err := inboxdb.New(ib.cfg.Pool).InboxHeldListForAggregate(ctx, inboxdb.InboxHeldListForAggregateParams{
		AggregateType: agg.AggregateType, AggregateID: agg.AggregateID,
	})
	if err != nil {
		return nil, fmt.Errorf("list held events: %w", err)
	}
	asked := make(map[uuid.UUID]bool, len(before))
	for _, h := range before {
		asked[h.EventID] = true
	}
	snap, ferr := ib.cfg.Fetch(ctx, agg.AggregateType, agg.AggregateID)
	switch {
	case errors.Is(ferr, ErrNotFound):
		reason := cleanText(fmt.Sprintf("resync: %s %s not found at the source of truth", agg.AggregateType, agg.AggregateID))
		var parked int
		err := ib.inLockedTx(ctx, agg, func(q *inboxdb.Queries, tx pgx.Tx, _ inboxdb.InboxAggregate) error {
			rows, err := q.InboxHeldParkAll(ctx, inboxdb.InboxHeldParkAllParams{AggregateType: agg.AggregateType, AggregateID: agg.AggregateID, Reason: reason})
			if err != nil {
				return fmt.Errorf("park held events: %w", err)
			}
			parked = len(rows)
			for _, h := range byVersion(rows) {
				if err := q.ProcessedEventSetOutcome(ctx, inboxdb.ProcessedEventSetOutcomeParams{EventID: h.EventID, Outcome: "parked"}); err != nil {
					return fmt.Errorf("mark held event parked: %w", err)
				}
				if ib.cfg.Rejected != nil {
					if err := ib.cfg.Rejected(ctx, tx, heldEvent(h), RejectNotFound); err != nil {
						return fmt.Errorf("reject parked %s v%d: %w", h.EventType, h.AggregateVersion, err)
					}
				}
			}
			// A conflict on an aggregate the source does not know: neither
			// event is the source's, and the newcomer is refused for good.
			pending, err := q.InboxConflictPending(ctx, inboxdb.InboxConflictPendingParams{AggregateType: agg.AggregateType, AggregateID: agg.AggregateID})
			if err != nil {
				return fmt.Errorf("list pending conflicts: %w", err)
			}
			for _, c := range pending {
				if err := q.InboxConflictResolve(ctx, inboxdb.InboxConflictResolveParams{EventID: c.EventID, Resolution: "impostor"}); err != nil {
					return fmt.Errorf("resolve conflict: %w", err)
				}
				if ib.cfg.Rejected != nil {
					if err := ib.cfg.Rejected(ctx, tx, conflictEvent(c), RejectNotFound); err != nil {
						return fmt.Errorf("reject conflicting %s v%d: %w", c.EventType, c.AggregateVersion, err)
					}
				}
			}
			return q.InboxAggregateCloseGap(ctx, inboxdb.InboxAggregateCloseGapParams{AggregateType: agg.AggregateType, AggregateID: agg.AggregateID})
		})
		if err != nil {
			ib.metrics.Resyncs.WithLabelValues(ResyncError).Inc()
			return nil, err
		}
		ib.metrics.Resyncs.WithLabelValues(ResyncNotFound).Inc()
		log.Error("inbox resync: source of truth has no such aggregate; held events parked", slog.Int("parked", parked), slog.String("reason", reason))
		return nil, nil

	case ferr != nil:
		ib.metrics.Resyncs.WithLabelValues(ResyncError).Inc()
		log.Error("inbox resync failed; will retry", slog.String("error", ferr.Error()), slog.Duration("retry_in", ib.cfg.ResyncRetry))
		return nil, ib.resyncFailed(ctx, agg, ferr.Error())
	}

	var done, covered, parked, rejected []Event
	var stale bool
	err = ib.inLockedTx(ctx, agg, func(q *inboxdb.Queries, tx pgx.Tx, cur inboxdb.InboxAggregate) error {
		done, covered, parked, rejected = nil, nil, nil, nil
		if cur.ResyncAfter == nil {
			return nil // the gap was filled while we were fetching
		}
		diverged := cur.DivergedAt != nil && cur.DivergedFrom != nil
		if diverged && snap.Events != nil {
			// A conflict put the local history from the fork point in doubt.
			// If the source wrote exactly those events, the newcomers were
			// impostors: nothing forked, and nothing is rebased.
			ok, err := localHistoryIsGenuine(ctx, q, agg, *cur.DivergedFrom, snap.Events)
			if err != nil {
				return err
			}
			if ok {
				if err := q.InboxAggregateUndiverge(ctx, inboxdb.InboxAggregateUndivergeParams{AggregateType: agg.AggregateType, AggregateID: agg.AggregateID}); err != nil {
					return fmt.Errorf("clear divergence: %w", err)
				}
				diverged = false
				log.Warn("inbox resync: the source of truth wrote the events applied here; the conflicting events are impostors",
					slog.Int64("conflict_version", *cur.DivergedFrom))
			}
		}
		last := cur.LastVersion
		switch {
		case diverged:
			// The local state belongs to a history the producer no longer
			// has: the snapshot replaces it, even at or below the version
			// that history reached, as long as the source has reached the
			// fork. Otherwise state never moves backwards.
			if snap.Version < *cur.DivergedFrom {
				// The source is not at the fork yet (a restored backup
				// catching up): keep holding.
				stale = true
				return q.InboxAggregateResyncFailed(ctx, inboxdb.InboxAggregateResyncFailedParams{
					RetrySeconds:  ib.cfg.ResyncRetry.Seconds(),
					LastError:     fmt.Sprintf("snapshot version %d is not ahead of version %d", snap.Version, *cur.DivergedFrom-1),
					AggregateType: agg.AggregateType, AggregateID: agg.AggregateID,
				})
			}
			snap.Rebase = true
			if err := ib.cfg.ApplySnapshot(ctx, tx, snap); err != nil {
				return fmt.Errorf("apply snapshot v%d: %w", snap.Version, err)
			}
			forked, err := q.ProcessedEventFork(ctx, inboxdb.ProcessedEventForkParams{
				AggregateType: agg.AggregateType, AggregateID: agg.AggregateID, FromVersion: *cur.DivergedFrom,
			})
			if err != nil {
				return fmt.Errorf("retire the forked history: %w", err)
			}
			if err := q.InboxAggregateRebase(ctx, inboxdb.InboxAggregateRebaseParams{
				NewVersion: snap.Version, AggregateType: agg.AggregateType, AggregateID: agg.AggregateID,
			}); err != nil {
				return fmt.Errorf("rebase on the snapshot: %w", err)
			}
			log.Warn("inbox resync: a forked aggregate now follows the source of truth",
				slog.Int64("fork_version", *cur.DivergedFrom), slog.Int64("snapshot_version", snap.Version),
				slog.Int64("forked_events", forked))
			last = snap.Version
		case snap.Version > cur.LastVersion:
			if err := ib.cfg.ApplySnapshot(ctx, tx, snap); err != nil {
				return fmt.Errorf("apply snapshot v%d: %w", snap.Version, err)
			}
			if _, err := q.InboxAggregateAdvance(ctx, inboxdb.InboxAggregateAdvanceParams{
				NewVersion: snap.Version, AggregateType: agg.AggregateType, AggregateID: agg.AggregateID,
			}); err != nil {
				return fmt.Errorf("advance to snapshot version: %w", err)
			}
			last = snap.Version
		default:
			// The source is not ahead of local state: there is no state to
			// take from it, but it still says which held events can never
			// become due (below).
		}

		var err error
		covered, rejected, err = ib.resolveConflicts(ctx, tx, q, agg, snap.Events, last)
		if err != nil {
			return err
		}
		c, p, r, err := ib.judgeHeld(ctx, tx, q, agg, snap, last, asked)
		if err != nil {
			return err
		}
		covered, parked, rejected = append(covered, c...), append(parked, p...), append(rejected, r...)
		done = append(done, covered...)

		// Restart the clock: whatever is still held waits a fresh window
		// for the versions between the snapshot and itself.
		if err := q.InboxAggregateCloseGap(ctx, inboxdb.InboxAggregateCloseGapParams{AggregateType: agg.AggregateType, AggregateID: agg.AggregateID}); err != nil {
			return fmt.Errorf("close gap: %w", err)
		}
		applied, drainParked, _, err := ib.drain(ctx, tx, q, agg.AggregateType, agg.AggregateID, last)
		if err != nil {
			return err
		}
		done = append(done, applied...)
		parked = append(parked, drainParked...)
		remaining, err := q.InboxHeldCountForAggregate(ctx, inboxdb.InboxHeldCountForAggregateParams{AggregateType: agg.AggregateType, AggregateID: agg.AggregateID})
		if err != nil {
			return fmt.Errorf("count held events: %w", err)
		}
		if remaining > 0 {
			return q.InboxAggregateOpenGap(ctx, inboxdb.InboxAggregateOpenGapParams{
				WindowSeconds: ib.cfg.GapWindow.Seconds(), AggregateType: agg.AggregateType, AggregateID: agg.AggregateID,
			})
		}
		return nil
	})
	if err != nil {
		ib.metrics.Resyncs.WithLabelValues(ResyncError).Inc()
		log.Error("inbox resync: applying the snapshot failed; will retry", slog.String("error", err.Error()))
		return nil, errors.Join(err, ib.resyncFailed(ctx, agg, err.Error()))
	}
	if stale {
		ib.metrics.Resyncs.WithLabelValues(ResyncStale).Inc()
		log.Warn("inbox resync: snapshot not ahead of local state; still holding", slog.Int64("snapshot_version", snap.Version))
		return nil, nil
	}
	ib.metrics.Resyncs.WithLabelValues(ResyncOK).Inc()
	for _, c := range covered {
		ib.metrics.Covered.WithLabelValues(c.Type).Inc()
	}
	for _, p := range parked {
		log.Error("inbox resync: held event failed when its turn came; parked for an operator", p.LogAttrs()...)
	}
	for _, r := range rejected {
		ib.metrics.Rejected.WithLabelValues(RejectImpostor).Inc()
		log.Error("inbox resync: the source of truth did not write this event at its version; rejected, kept for an operator", r.LogAttrs()...)
	}
	log.Info("inbox resync: continued from the snapshot", slog.Int64("snapshot_version", snap.Version), slog.Int("handled_held", len(done)))
	return done, nil
}

// localHistoryIsGenuine reports whether every event applied here for the
// aggregate from version from on is the one the source wrote at its
// version.
func localHistoryIsGenuine(ctx context.Context, q *inboxdb.Queries, agg inboxdb.InboxAggregate, from int64, events map[int64]uuid.UUID) (bool, error) {
	owners, err := q.ProcessedEventOwnersFrom(ctx, inboxdb.ProcessedEventOwnersFromParams{
		AggregateType: agg.AggregateType, AggregateID: agg.AggregateID, FromVersion: from,
	})
	if err != nil {
		return false, fmt.Errorf("read the local history: %w", err)
	}
	for _, o := range owners {
		if events[o.AggregateVersion] != o.EventID {
			return false, nil
		}
	}
	return true, nil
}

// resolveConflicts settles the aggregate's pending conflicts with the
// source's word, once local state reflects version last. A newcomer the
// source wrote at its version is genuine: its version is already placed
// (by the history it agrees with, or by the snapshot), so it is handled as
// a covered event and its own effects run, once. Any other newcomer is an
// impostor and is rejected. When the source cannot tell (events is nil),
// the conflict is refused as before, without a verdict.
func (ib *Inbox) resolveConflicts(ctx context.Context, tx pgx.Tx, q *inboxdb.Queries, agg inboxdb.InboxAggregate,
	events map[int64]uuid.UUID, last int64,
) (done, rejected []Event, err error) {
	pending, err := q.InboxConflictPending(ctx, inboxdb.InboxConflictPendingParams{AggregateType: agg.AggregateType, AggregateID: agg.AggregateID})
	if err != nil {
		return nil, nil, fmt.Errorf("list pending conflicts: %w", err)
	}
	for _, c := range pending {
		e := conflictEvent(c)
		resolution, reason, outcome := "impostor", RejectImpostor, "rejected"
		switch {
		case events == nil:
			resolution, reason, outcome = "unverified", RejectConflict, "conflict"
		case events[c.AggregateVersion] == c.EventID && c.AggregateVersion <= last:
			err := savepoint(ctx, tx, func(sp pgx.Tx) error {
				sq := inboxdb.New(sp)
				if err := sq.ProcessedEventSetOutcome(ctx, inboxdb.ProcessedEventSetOutcomeParams{EventID: e.ID, Outcome: "covered"}); err != nil {
					return fmt.Errorf("mark genuine event covered: %w", err)
				}
				if err := sq.InboxConflictResolve(ctx, inboxdb.InboxConflictResolveParams{EventID: e.ID, Resolution: "genuine"}); err != nil {
					return fmt.Errorf("resolve conflict: %w", err)
				}
				if ib.cfg.Covered == nil {
					return nil
				}
				return ib.cfg.Covered(ctx, sp, e)
			})
			if err != nil {
				return nil, nil, fmt.Errorf("genuine %s v%d: %w", e.Type, e.AggregateVersion, err)
			}
			done = append(done, e)
			continue
		case events[c.AggregateVersion] == c.EventID:
			continue // genuine, and its version is not placed yet: the next resync
		}
		if err := q.ProcessedEventSetOutcome(ctx, inboxdb.ProcessedEventSetOutcomeParams{EventID: e.ID, Outcome: outcome}); err != nil {
			return nil, nil, fmt.Errorf("mark conflicting event: %w", err)
		}
		if err := q.InboxConflictResolve(ctx, inboxdb.InboxConflictResolveParams{EventID: e.ID, Resolution: resolution}); err != nil {
			return nil, nil, fmt.Errorf("resolve conflict: %w", err)
		}
		if ib.cfg.Rejected != nil {
			if err := ib.cfg.Rejected(ctx, tx, e, reason); err != nil {
				return nil, nil, fmt.Errorf("reject conflicting %s v%d: %w", e.Type, e.AggregateVersion, err)
			}
		}
		if reason == RejectImpostor {
			rejected = append(rejected, e)
		}
	}
	return done, rejected, nil
}

// judgeHeld decides, once local state reflects version last, what becomes
// of each held event of the aggregate:
//
//   - at or below last: its version is placed. The source's own event is
//     handed to Covered (its effects still happen); any other is rejected.
//   - above last, asked about (held when the snapshot was fetched) and not
//     the source's event at its version: it can never become due (the
//     source is past it with another event, or has no such version), so it
//     is rejected instead of holding the gap open for ever.
//   - otherwise it stays held for the versions still missing.
func (ib *Inbox) judgeHeld(ctx context.Context, tx pgx.Tx, q *inboxdb.Queries, agg inboxdb.InboxAggregate,
	snap Snapshot, last int64, asked map[uuid.UUID]bool,
) (done, parked, rejected []Event, err error) {
	held, err := q.InboxHeldListForAggregate(ctx, inboxdb.InboxHeldListForAggregateParams{AggregateType: agg.AggregateType, AggregateID: agg.AggregateID})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("list held events: %w", err)
	}
	for _, h := range byVersion(held) {
		if h.State != "held" {
			continue
		}
		e := heldEvent(h)
		genuine := snap.Events == nil || snap.Events[h.AggregateVersion] == h.EventID
		switch {
		case h.AggregateVersion <= last && genuine:
			ok, err := ib.coverHeld(ctx, tx, q, e)
			if err != nil {
				return nil, nil, nil, err
			}
			if ok {
				done = append(done, e)
			} else {
				parked = append(parked, e)
			}
		case h.AggregateVersion <= last:
			reason := fmt.Sprintf("the source of truth wrote another event at version %d", h.AggregateVersion)
			if err := ib.rejectHeld(ctx, tx, q, e, reason, nil, RejectImpostor); err != nil {
				return nil, nil, nil, err
			}
			rejected = append(rejected, e)
		case asked[h.EventID] && (snap.Events == nil || snap.Events[h.AggregateVersion] != h.EventID) && h.AggregateVersion > snap.Version:
			reason := fmt.Sprintf("version %d is beyond the source of truth's version %d, and the source wrote no such event", h.AggregateVersion, snap.Version)
			if snap.Events != nil {
				if _, ok := snap.Events[h.AggregateVersion]; ok {
					reason = fmt.Sprintf("the source of truth wrote another event at version %d", h.AggregateVersion)
				}
			}
			if err := ib.rejectHeld(ctx, tx, q, e, reason, nil, RejectImpostor); err != nil {
				return nil, nil, nil, err
			}
			rejected = append(rejected, e)
		}
	}
	return done, parked, rejected, nil
}

// coverHeld releases a held event whose version a snapshot placed: it is
// marked superseded and handed to Covered. If its own effect fails for a
// reason other than the infrastructure, it is parked for an operator
// rather than lost or failing the whole resync for ever (ok is false).
func (ib *Inbox) coverHeld(ctx context.Context, tx pgx.Tx, q *inboxdb.Queries, e Event) (ok bool, err error) {
	err = savepoint(ctx, tx, func(sp pgx.Tx) error {
		sq := inboxdb.New(sp)
		if err := sq.InboxHeldDelete(ctx, e.ID); err != nil {
			return fmt.Errorf("release held event: %w", err)
		}
		if err := sq.ProcessedEventSetOutcome(ctx, inboxdb.ProcessedEventSetOutcomeParams{EventID: e.ID, Outcome: "superseded"}); err != nil {
			return fmt.Errorf("mark held event superseded: %w", err)
		}
		if ib.cfg.Covered == nil {
			return nil
		}
		return ib.cfg.Covered(ctx, sp, e)
	})
	switch {
	case err == nil:
		return true, nil
	case IsTransient(err):
		return false, err
	}
	if err := parkHeld(ctx, q, e, fmt.Errorf("covered by a resync snapshot, then: %w", err)); err != nil {
		return false, err
	}
	return false, nil
}

// rejectHeld takes a held (or parked) event out of its aggregate's
// sequence, keeping it and the reason for an operator, and lets the
// consumer account for effects it owed (reason for Rejected).
func (ib *Inbox) rejectHeld(ctx context.Context, tx pgx.Tx, q *inboxdb.Queries, e Event, why string, actor *string, reason string) error {
	if _, err := q.InboxHeldReject(ctx, inboxdb.InboxHeldRejectParams{EventID: e.ID, Reason: cleanText(why), Actor: actor}); err != nil {
		return fmt.Errorf("reject held event: %w", err)
	}
	if err := q.ProcessedEventSetOutcome(ctx, inboxdb.ProcessedEventSetOutcomeParams{EventID: e.ID, Outcome: "rejected"}); err != nil {
		return fmt.Errorf("mark held event rejected: %w", err)
	}
	if ib.cfg.Rejected != nil {
		if err := ib.cfg.Rejected(ctx, tx, e, reason); err != nil {
			return fmt.Errorf("reject held %s v%d: %w", e.Type, e.AggregateVersion, err)
		}
	}
	return nil
}

func conflictEvent(c inboxdb.InboxConflict) Event {
	e := Event{
		ID: c.EventID, AggregateType: c.AggregateType, AggregateID: c.AggregateID,
		AggregateVersion: c.AggregateVersion, Type: c.EventType, Payload: c.Payload, Time: c.DetectedAt,
	}
	if c.SchemaVersion != nil {
		e.SchemaVersion = int(*c.SchemaVersion)
	}
	if c.EventTime != nil {
		e.Time = *c.EventTime
	}
	return e
}

func byVersion(rows []inboxdb.InboxHeldEvent) []inboxdb.InboxHeldEvent {
	slices.SortFunc(rows, func(a, b inboxdb.InboxHeldEvent) int { return cmp.Compare(a.AggregateVersion, b.AggregateVersion) })
	return rows
}

func (ib *Inbox) resyncFailed(ctx context.Context, agg inboxdb.InboxAggregate, msg string) error {
	err := inboxdb.New(ib.cfg.Pool).InboxAggregateResyncFailed(ctx, inboxdb.InboxAggregateResyncFailedParams{
		RetrySeconds: ib.cfg.ResyncRetry.Seconds(), LastError: cleanText(msg),
		AggregateType: agg.AggregateType, AggregateID: agg.AggregateID,
	})
	if err != nil {
		return fmt.Errorf("record resync failure: %w", err)
	}
	return nil
}

// inLockedTx runs fn in a transaction holding the aggregate's row lock, the
// same lock Process takes, so a resync and a consumer never interleave on
// one aggregate.
func (ib *Inbox) inLockedTx(ctx context.Context, agg inboxdb.InboxAggregate,
	fn func(q *inboxdb.Queries, tx pgx.Tx, cur inboxdb.InboxAggregate) error,
) error {
	return pgx.BeginFunc(ctx, ib.cfg.Pool, func(tx pgx.Tx) error {
		q := inboxdb.New(tx)
		cur, err := q.InboxAggregateLock(ctx, inboxdb.InboxAggregateLockParams{AggregateType: agg.AggregateType, AggregateID: agg.AggregateID})
		if err != nil {
			return fmt.Errorf("lock inbox aggregate: %w", err)
		}
		return fn(q, tx, cur)
	})
}
