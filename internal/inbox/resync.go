package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxref/orders/internal/inbox/inboxdb"
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

// ResyncDue resolves up to limit aggregates whose gap outlived the window:
// it alerts (log and the inbox_gaps_overdue gauge), fetches a snapshot,
// continues from the snapshot's version and applies the held events that
// still follow it. Held events the snapshot covers are handed to Covered
// (their own effects still happen), never applied: local state never moves
// backwards. A snapshot that is not ahead of local state, or a failed
// fetch, is retried after ResyncRetry. It returns the events whose Apply or
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

	var done, parked []Event
	var stale bool
	err := ib.inLockedTx(ctx, agg, func(q *inboxdb.Queries, tx pgx.Tx, cur inboxdb.InboxAggregate) error {
		done, parked = nil, nil
		if cur.ResyncAfter == nil {
			return nil // the gap was filled while we were fetching
		}
		// A diverged aggregate's local state belongs to a history the
		// producer no longer has: the snapshot replaces it, even at or below
		// the version that history reached, as long as the source has
		// reached the fork. Otherwise state never moves backwards.
		diverged := cur.DivergedAt != nil && cur.DivergedFrom != nil
		behind, floor := snap.Version <= cur.LastVersion, cur.LastVersion
		if diverged {
			behind, floor = snap.Version < *cur.DivergedFrom, *cur.DivergedFrom-1
		}
		if behind {
			// The source is not ahead of us (a lagging read, or a restored
			// backup). Applying it would move state backwards: keep holding.
			stale = true
			return q.InboxAggregateResyncFailed(ctx, inboxdb.InboxAggregateResyncFailedParams{
				RetrySeconds:  ib.cfg.ResyncRetry.Seconds(),
				LastError:     fmt.Sprintf("snapshot version %d is not ahead of version %d", snap.Version, floor),
				AggregateType: agg.AggregateType, AggregateID: agg.AggregateID,
			})
		}
		snap.Rebase = diverged
		if err := ib.cfg.ApplySnapshot(ctx, tx, snap); err != nil {
			return fmt.Errorf("apply snapshot v%d: %w", snap.Version, err)
		}
		if diverged {
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
		} else if _, err := q.InboxAggregateAdvance(ctx, inboxdb.InboxAggregateAdvanceParams{
			NewVersion: snap.Version, AggregateType: agg.AggregateType, AggregateID: agg.AggregateID,
		}); err != nil {
			return fmt.Errorf("advance to snapshot version: %w", err)
		}
		covered, err := q.InboxHeldTakeCovered(ctx, inboxdb.InboxHeldTakeCoveredParams{
			AggregateType: agg.AggregateType, AggregateID: agg.AggregateID, SnapshotVersion: snap.Version,
		})
		if err != nil {
			return fmt.Errorf("take covered held events: %w", err)
		}
		for _, h := range byVersion(covered) {
			e := heldEvent(h)
			err := savepoint(ctx, tx, func(sp pgx.Tx) error {
				if err := inboxdb.New(sp).ProcessedEventSetOutcome(ctx, inboxdb.ProcessedEventSetOutcomeParams{EventID: e.ID, Outcome: "superseded"}); err != nil {
					return fmt.Errorf("mark held event superseded: %w", err)
				}
				if ib.cfg.Covered == nil {
					return nil
				}
				return ib.cfg.Covered(ctx, sp, e)
			})
			switch {
			case err == nil:
				done = append(done, e)
			case IsTransient(err):
				return err
			default:
				// Its own effect failed: keep the event for an operator
				// rather than lose it or fail the whole resync for ever.
				if err := q.InboxHeldInsert(ctx, inboxdb.InboxHeldInsertParams{
					EventID: e.ID, AggregateType: e.AggregateType, AggregateID: e.AggregateID,
					AggregateVersion: e.AggregateVersion, EventType: e.Type, SchemaVersion: int32(e.SchemaVersion),
					EventTime: e.Time, Payload: e.Payload,
				}); err != nil {
					return fmt.Errorf("keep covered event: %w", err)
				}
				if err := parkHeld(ctx, q, e, fmt.Errorf("covered by a resync snapshot, then: %w", err)); err != nil {
					return err
				}
				parked = append(parked, e)
			}
		}
		// Restart the clock: whatever is still held waits a fresh window
		// for the versions between the snapshot and itself.
		if err := q.InboxAggregateCloseGap(ctx, inboxdb.InboxAggregateCloseGapParams{AggregateType: agg.AggregateType, AggregateID: agg.AggregateID}); err != nil {
			return fmt.Errorf("close gap: %w", err)
		}
		applied, drainParked, _, err := ib.drain(ctx, tx, q, agg.AggregateType, agg.AggregateID, snap.Version)
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
	for _, p := range parked {
		log.Error("inbox resync: held event failed when its turn came; parked for an operator", p.LogAttrs()...)
	}
	log.Info("inbox resync: continued from the snapshot", slog.Int64("snapshot_version", snap.Version), slog.Int("handled_held", len(done)))
	return done, nil
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
