package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
}

// Resync tells the inbox how to resolve a gap from the source of truth.
type Resync struct {
	// Fetch reads the aggregate from the source of truth. It runs outside
	// any transaction (no lock is held across the network call) and
	// returns ErrNotFound when the aggregate does not exist there.
	Fetch func(ctx context.Context, aggregateType, aggregateID string) (Snapshot, error)
	// ApplySnapshot replaces the local state of the aggregate inside tx.
	ApplySnapshot func(ctx context.Context, tx pgx.Tx, s Snapshot) error
	// Apply is the business change for held events that follow the
	// snapshot, the same function given to Process.
	Apply ApplyFunc
}

// ResyncDue resolves up to limit aggregates whose gap outlived the window:
// it alerts (log and the inbox_gaps_overdue gauge), fetches a snapshot,
// continues from the snapshot's version and applies the held events that
// still follow it. Held events the snapshot already covers are superseded,
// never applied; local state never moves backwards. A snapshot that is not
// ahead of local state, or a failed fetch, is retried after ResyncRetry. It
// returns the events applied, for callers that react to new work.
func (ib *Inbox) ResyncDue(ctx context.Context, pool *pgxpool.Pool, rs Resync, limit int) ([]Event, error) {
	due, err := inboxdb.New(pool).InboxGapsDue(ctx, int32(limit))
	if err != nil {
		return nil, fmt.Errorf("list overdue gaps: %w", err)
	}
	var applied []Event
	var errs []error
	for _, agg := range due {
		evs, err := ib.resyncOne(ctx, pool, rs, agg)
		applied = append(applied, evs...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return applied, errors.Join(errs...)
}

func (ib *Inbox) resyncOne(ctx context.Context, pool *pgxpool.Pool, rs Resync, agg inboxdb.InboxAggregate) ([]Event, error) {
	log := ib.log.With(slog.String("aggregate_type", agg.AggregateType), slog.String("aggregate_id", agg.AggregateID),
		slog.Int64("last_applied_version", agg.LastVersion))
	var waited time.Duration
	if agg.GapSince != nil {
		waited = time.Since(*agg.GapSince).Round(time.Millisecond)
	}
	log.Warn("inbox gap outlived its window: resynchronising from the source of truth",
		slog.Duration("gap_age", waited), slog.Int("resync_attempts", int(agg.ResyncAttempts)))

	snap, ferr := rs.Fetch(ctx, agg.AggregateType, agg.AggregateID)
	switch {
	case errors.Is(ferr, ErrNotFound):
		reason := fmt.Sprintf("resync: %s %s not found at the source of truth", agg.AggregateType, agg.AggregateID)
		var parked int64
		err := ib.inLockedTx(ctx, pool, agg, func(q *inboxdb.Queries, _ pgx.Tx, _ inboxdb.InboxAggregate) error {
			var err error
			parked, err = q.InboxHeldPark(ctx, inboxdb.InboxHeldParkParams{AggregateType: agg.AggregateType, AggregateID: agg.AggregateID, Reason: reason})
			if err != nil {
				return fmt.Errorf("park held events: %w", err)
			}
			return q.InboxAggregateCloseGap(ctx, inboxdb.InboxAggregateCloseGapParams{AggregateType: agg.AggregateType, AggregateID: agg.AggregateID})
		})
		if err != nil {
			ib.metrics.Resyncs.WithLabelValues(ResyncError).Inc()
			return nil, err
		}
		ib.metrics.Resyncs.WithLabelValues(ResyncNotFound).Inc()
		log.Error("inbox resync: source of truth has no such aggregate; held events parked", slog.Int64("parked", parked), slog.String("reason", reason))
		return nil, nil

	case ferr != nil:
		ib.metrics.Resyncs.WithLabelValues(ResyncError).Inc()
		log.Error("inbox resync failed; will retry", slog.String("error", ferr.Error()), slog.Duration("retry_in", ib.resyncRetry))
		return nil, ib.resyncFailed(ctx, pool, agg, ferr.Error())
	}

	var applied []Event
	var stale bool
	err := ib.inLockedTx(ctx, pool, agg, func(q *inboxdb.Queries, tx pgx.Tx, cur inboxdb.InboxAggregate) error {
		if cur.ResyncAfter == nil {
			return nil // the gap was filled while we were fetching
		}
		if snap.Version <= cur.LastVersion {
			// The source is not ahead of us (a lagging read, or a restored
			// backup). Applying it would move state backwards: keep holding.
			stale = true
			return q.InboxAggregateResyncFailed(ctx, inboxdb.InboxAggregateResyncFailedParams{
				RetrySeconds:  ib.resyncRetry.Seconds(),
				LastError:     fmt.Sprintf("snapshot version %d is not ahead of applied version %d", snap.Version, cur.LastVersion),
				AggregateType: agg.AggregateType, AggregateID: agg.AggregateID,
			})
		}
		if err := rs.ApplySnapshot(ctx, tx, snap); err != nil {
			return fmt.Errorf("apply snapshot v%d: %w", snap.Version, err)
		}
		if _, err := q.InboxAggregateAdvance(ctx, inboxdb.InboxAggregateAdvanceParams{
			NewVersion: snap.Version, AggregateType: agg.AggregateType, AggregateID: agg.AggregateID,
		}); err != nil {
			return fmt.Errorf("advance to snapshot version: %w", err)
		}
		superseded, err := q.InboxHeldSupersede(ctx, inboxdb.InboxHeldSupersedeParams{
			AggregateType: agg.AggregateType, AggregateID: agg.AggregateID, SnapshotVersion: snap.Version,
		})
		if err != nil {
			return fmt.Errorf("supersede held events: %w", err)
		}
		if superseded > 0 {
			log.Warn("inbox resync: held events covered by the snapshot are superseded, not applied",
				slog.Int64("superseded", superseded), slog.Int64("snapshot_version", snap.Version))
		}
		// Restart the clock: whatever is still held waits a fresh window
		// for the versions between the snapshot and itself.
		if err := q.InboxAggregateCloseGap(ctx, inboxdb.InboxAggregateCloseGapParams{AggregateType: agg.AggregateType, AggregateID: agg.AggregateID}); err != nil {
			return fmt.Errorf("close gap: %w", err)
		}
		applied, _, err = ib.drain(ctx, tx, q, agg.AggregateType, agg.AggregateID, snap.Version, rs.Apply)
		if err != nil {
			return err
		}
		remaining, err := q.InboxHeldCountForAggregate(ctx, inboxdb.InboxHeldCountForAggregateParams{AggregateType: agg.AggregateType, AggregateID: agg.AggregateID})
		if err != nil {
			return fmt.Errorf("count held events: %w", err)
		}
		if remaining > 0 {
			return q.InboxAggregateOpenGap(ctx, inboxdb.InboxAggregateOpenGapParams{
				WindowSeconds: ib.gapWindow.Seconds(), AggregateType: agg.AggregateType, AggregateID: agg.AggregateID,
			})
		}
		return nil
	})
	if err != nil {
		ib.metrics.Resyncs.WithLabelValues(ResyncError).Inc()
		log.Error("inbox resync: applying the snapshot failed; will retry", slog.String("error", err.Error()))
		return nil, errors.Join(err, ib.resyncFailed(ctx, pool, agg, err.Error()))
	}
	if stale {
		ib.metrics.Resyncs.WithLabelValues(ResyncStale).Inc()
		log.Warn("inbox resync: snapshot not ahead of local state; still holding", slog.Int64("snapshot_version", snap.Version))
		return nil, nil
	}
	ib.metrics.Resyncs.WithLabelValues(ResyncOK).Inc()
	log.Info("inbox resync: continued from the snapshot", slog.Int64("snapshot_version", snap.Version), slog.Int("applied_held", len(applied)))
	return applied, nil
}

func (ib *Inbox) resyncFailed(ctx context.Context, pool *pgxpool.Pool, agg inboxdb.InboxAggregate, msg string) error {
	err := inboxdb.New(pool).InboxAggregateResyncFailed(ctx, inboxdb.InboxAggregateResyncFailedParams{
		RetrySeconds: ib.resyncRetry.Seconds(), LastError: msg,
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
func (ib *Inbox) inLockedTx(ctx context.Context, pool *pgxpool.Pool, agg inboxdb.InboxAggregate,
	fn func(q *inboxdb.Queries, tx pgx.Tx, cur inboxdb.InboxAggregate) error,
) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q := inboxdb.New(tx)
		cur, err := q.InboxAggregateLock(ctx, inboxdb.InboxAggregateLockParams{AggregateType: agg.AggregateType, AggregateID: agg.AggregateID})
		if err != nil {
			return fmt.Errorf("lock inbox aggregate: %w", err)
		}
		return fn(q, tx, cur)
	})
}
