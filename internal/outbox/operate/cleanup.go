package operate

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
)

// cleanupLockKey serialises outbox cleanups across every process that runs
// one (O6).
const cleanupLockKey = 7_215_402_116

// Cleanup is the retention of delivered rows (O6). Delivered outbox rows
// are only useful for a while: to answer "was it sent, and where?", to
// replay it, and in a restore from backup. After Retention they are moved
// to outbox_archive, which keeps the identity and broker position but not
// the payload (where personal data lives).
type Cleanup struct {
	// Retention is how long a delivered row stays in the outbox, counted
	// from its delivery. It must cover the replay window an operator needs.
	Retention time.Duration
	// BatchSize is the rows moved per statement; Pause the wait between two
	// statements, so a large backlog is removed without a burst of I/O.
	BatchSize int
	Pause     time.Duration
}

func newCleanupCounter() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outbox_cleanup_deleted_total",
		Help: "Rows deleted by the retention cleanup, by table; deleted outbox rows are archived first (identity and broker position).",
	}, []string{"table"})
	c.WithLabelValues("outbox")
	c.WithLabelValues("outbox_direct_log")
	return c
}

// Cleanup moves delivered rows older than c.Retention to the archive, in
// batches, oldest first, until none is left, then deletes the direct
// path's log (O7) older than c.Retention the same way, and returns how
// many rows it removed.
// One run at a time across all processes: the run holds a session-level
// advisory lock on one connection from start to end, and a process that
// finds it taken returns at once with 0. Pending and parked rows are never
// touched, whatever their age. Each batch is one statement (delete and
// archive together), so a crash mid-run loses nothing and the next run
// continues where it stopped.
func (a *Admin) Cleanup(ctx context.Context, c Cleanup) (int64, error) {
	if c.Retention <= 0 || c.BatchSize <= 0 || c.Pause < 0 {
		return 0, fmt.Errorf("outbox cleanup: retention (%s) and batch size (%d) must be positive", c.Retention, c.BatchSize)
	}
	conn, err := a.pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("outbox cleanup: %w", err)
	}
	defer conn.Release()
	q := outboxdb.New(conn)
	if locked, err := q.CleanupLock(ctx, cleanupLockKey); err != nil || !locked {
		return 0, err
	}
	defer func() {
		if _, err := q.CleanupUnlock(context.WithoutCancel(ctx), cleanupLockKey); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx)) // ending the session releases the lock
		}
	}()
	// Each batch is read in its index's order whatever the statistics say
	// (see outboxdb.ClaimInIndexOrder), for this session until the run ends.
	if _, err := conn.Exec(ctx, outboxdb.CleanupInIndexOrder); err != nil {
		return 0, fmt.Errorf("outbox cleanup: %w", err)
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), "RESET enable_sort"); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		} else if _, err := conn.Exec(context.WithoutCancel(ctx), "RESET jit"); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()
	var total int64
	// The cursor starts before every row: the zero uuid and the earliest
	// time PostgreSQL stores.
	after, afterID := time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), uuid.Nil
	for {
		rows, err := q.ArchiveDelivered(ctx, outboxdb.ArchiveDeliveredParams{
			RetentionSeconds: c.Retention.Seconds(), AfterDeliveredAt: after, AfterEventID: afterID, BatchSize: int32(c.BatchSize),
		})
		if err != nil {
			return total, fmt.Errorf("outbox cleanup: archive a batch: %w", err)
		}
		n := int64(len(rows))
		total += n
		a.deleted.WithLabelValues("outbox").Add(float64(n))
		for _, r := range rows {
			if r.DeliveredAt == nil {
				continue
			}
			if r.DeliveredAt.After(after) || (r.DeliveredAt.Equal(after) && r.EventID.String() > afterID.String()) {
				after, afterID = *r.DeliveredAt, r.EventID
			}
		}
		if n < int64(c.BatchSize) {
			break
		}
		if err := pause(ctx, c.Pause); err != nil {
			return total, err
		}
	}
	// The direct path's log (O7) follows the same retention, by send time.
	before := time.Now().Add(-c.Retention)
	for {
		n, err := q.DirectLogCleanup(ctx, outboxdb.DirectLogCleanupParams{SentBefore: before, BatchSize: int32(c.BatchSize)})
		if err != nil {
			return total, fmt.Errorf("outbox cleanup: delete a batch of the direct log: %w", err)
		}
		total += n
		a.deleted.WithLabelValues("outbox_direct_log").Add(float64(n))
		if n < int64(c.BatchSize) {
			return total, nil
		}
		if err := pause(ctx, c.Pause); err != nil {
			return total, err
		}
	}
}

// pause waits d between two batches, or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
