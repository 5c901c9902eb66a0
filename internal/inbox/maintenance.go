package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/orders/internal/inbox/internal/inboxdb"
)

// ErrRetentionTooShort is returned by CheckRetention.
var ErrRetentionTooShort = errors.New("inbox: processed_event retention too short")

// CheckRetention enforces C5: a processed_event marker must outlive every
// way the same event can come back. The broker may redeliver within its
// redelivery window, and restoring the consumer's database from the oldest
// backup brings back offsets that old, so the broker replays everything
// since. A marker deleted before both have passed turns a late copy into a
// second business effect.
func CheckRetention(ttl, brokerRedelivery, backupRetention time.Duration) error {
	if need := brokerRedelivery + backupRetention; ttl < need {
		return fmt.Errorf("%w: the retention (%s) is shorter than the broker's redelivery window (%s) plus the backup retention (%s) = %s; "+
			"a redelivered or replayed event older than the retention would be applied again",
			ErrRetentionTooShort, ttl, brokerRedelivery, backupRetention, need)
	}
	return nil
}

// cleanupLockKey serialises cleaners across instances (O6).
const cleanupLockKey = 7_215_402_114

// Cleanup deletes processed_event markers older than ttl, batchSize rows per
// statement, oldest first, with a pause between batches, until no expired
// row is left. Each batch starts past the last marker the one before it
// deleted, so a run costs time linear in what it deletes however long
// vacuum keeps the deleted markers' index entries. One run at a time across all instances: the run holds a
// session-level advisory lock on one connection from start to end, and an
// instance that finds it taken returns at once. Each batch is a short
// statement of its own, so the cleanup never holds row locks for long or
// bloats one transaction. Markers of held or parked events are never
// deleted. It returns the number of rows deleted.
func (ib *Inbox) Cleanup(ctx context.Context, ttl time.Duration, batchSize int, pause time.Duration) (int64, error) {
	if batchSize <= 0 || ttl <= 0 || pause < 0 {
		return 0, fmt.Errorf("clean up processed events: batch size (%d) and TTL (%s) must be positive", batchSize, ttl)
	}
	var total int64
	err := withCleanupLock(ctx, ib.cfg.Pool, cleanupLockKey, func(q *inboxdb.Queries) error {
		// Each batch starts past the last marker the one before it deleted
		// (see the query); the first one before every marker.
		p := inboxdb.ProcessedEventCleanupParams{TtlSeconds: ttl.Seconds(), BatchSize: int32(batchSize),
			AfterProcessedAt: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)}
		for {
			r, err := q.ProcessedEventCleanup(ctx, p)
			if err != nil {
				return err
			}
			p.AfterProcessedAt, p.AfterEventID = r.LastProcessedAt, r.LastEventID
			n := r.Deleted
			total += n
			ib.metrics.Cleaned.Add(float64(n))
			if n < int64(batchSize) {
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(pause):
			}
		}
	})
	if err != nil {
		return total, fmt.Errorf("clean up processed events: %w", err)
	}
	return total, nil
}

// withCleanupLock runs fn on one connection of pool while it holds the
// session-level advisory lock key, or returns nil at once when another
// session holds it. The lock is released when fn returns, and by
// PostgreSQL if the process dies.
func withCleanupLock(ctx context.Context, pool *pgxpool.Pool, key int64, fn func(q *inboxdb.Queries) error) (err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	q := inboxdb.New(conn)
	locked, err := q.CleanupLock(ctx, key)
	if err != nil || !locked {
		return err
	}
	defer func() {
		if _, uerr := q.CleanupUnlock(context.WithoutCancel(ctx), key); uerr != nil {
			// The session is in doubt; closing it releases the lock.
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()
	// Each batch is read in its index's order, whatever the statistics say:
	// with statistics taken before a burst, the planner would sort every
	// expired row to delete the first batch, for each batch. For this
	// session, until the run ends; JIT goes too, since the sort penalty
	// lifts the plan's cost past its threshold.
	if _, err := conn.Exec(ctx, "SELECT set_config('enable_sort', 'off', false), set_config('jit', 'off', false)"); err != nil {
		return fmt.Errorf("prefer index order: %w", err)
	}
	defer func() {
		bg := context.WithoutCancel(ctx)
		if _, rerr := conn.Exec(bg, "RESET enable_sort"); rerr != nil {
			_ = conn.Conn().Close(bg)
		} else if _, rerr := conn.Exec(bg, "RESET jit"); rerr != nil {
			_ = conn.Conn().Close(bg)
		}
	}()
	return fn(q)
}

// Stats are the inbox's table counts.
type Stats struct {
	Held          int64 // events held for a gap
	ParkedEvents  int64 // held events parked by a failed resync or change
	ParkedRecords int64 // undecodable records parked by ParkRecord
	GapsOverdue   int64 // aggregates past their gap window
}

// RefreshStats reads the inbox's counts and sets its gauges.
func (ib *Inbox) RefreshStats(ctx context.Context) (Stats, error) {
	q := inboxdb.New(ib.cfg.Pool)
	hs, err := q.InboxHeldStats(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("count held events: %w", err)
	}
	pr, err := q.InboxParkedRecordCount(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("count parked records: %w", err)
	}
	overdue, err := q.InboxGapsOverdueCount(ctx, ib.cfg.GapWindow.Seconds())
	if err != nil {
		return Stats{}, fmt.Errorf("count overdue gaps: %w", err)
	}
	s := Stats{Held: hs.Held, ParkedEvents: hs.Parked, ParkedRecords: pr, GapsOverdue: overdue}
	ib.metrics.Held.Set(float64(s.Held))
	ib.metrics.Parked.Set(float64(s.ParkedEvents))
	ib.metrics.GapsOverdue.Set(float64(s.GapsOverdue))
	ib.metrics.ParkedRecords.Set(float64(s.ParkedRecords))
	return s, nil
}
