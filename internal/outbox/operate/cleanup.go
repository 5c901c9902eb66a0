package operate

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/orders/internal/outbox/operate/internal/opsdb"
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

// cleanupMetrics are the retention's metrics, one collector for the
// service's registry (Admin.Collector).
type cleanupMetrics struct {
	deleted *prometheus.CounterVec // rows removed, by table
	runs    *prometheus.CounterVec // RunCleanup's runs, by result
}

func newCleanupMetrics() cleanupMetrics {
	m := cleanupMetrics{
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_cleanup_deleted_total",
			Help: "Rows deleted by the retention cleanup, by table; deleted outbox rows are archived first (identity and broker position).",
		}, []string{"table"}),
		// A failing cleanup is silent otherwise: nothing breaks until the
		// table has grown for weeks, or payloads outlive their retention.
		// Alert on failed runs, or on no ok run for several intervals.
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_cleanup_runs_total",
			Help: "Runs of the periodic retention cleanup (RunCleanup), by result: ok or failed.",
		}, []string{"result"}),
	}
	m.deleted.WithLabelValues("outbox")
	m.deleted.WithLabelValues("outbox_direct_log")
	m.runs.WithLabelValues("ok")
	m.runs.WithLabelValues("failed")
	return m
}

// Describe implements prometheus.Collector.
func (m cleanupMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.deleted.Describe(ch)
	m.runs.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m cleanupMetrics) Collect(ch chan<- prometheus.Metric) {
	m.deleted.Collect(ch)
	m.runs.Collect(ch)
}

// maxFirstCleanupDelay is how long RunCleanup waits before its first run
// at most. Not at once: after a deployment every process starts within
// seconds, and the database is busiest then with connection set-up and
// the relays' catch-up.
const maxFirstCleanupDelay = time.Minute

// RunCleanup runs the retention cleanup c (Admin.Cleanup) every interval
// until ctx ends, so that a service starts one goroutine instead of
// writing its own loop. The first run comes after interval or a minute,
// whichever is shorter; the next interval is counted from the end of a
// run, so a long run never overlaps the next. Every process of a service
// may run it: the advisory lock lets one run at a time, and the others
// return at once.
//
// A failed run is logged on log and counted in
// outbox_cleanup_runs_total{result="failed"}; the next interval tries
// again, and continues where the failed run stopped. A run that removed
// rows is logged at info level. RunCleanup returns when ctx ends; it
// returns at once, after logging it, when c is invalid or interval is not
// positive.
func (a *Admin) RunCleanup(ctx context.Context, c Cleanup, interval time.Duration, log *slog.Logger) {
	if err := c.check(); err != nil || interval <= 0 {
		log.ErrorContext(ctx, "outbox cleanup not started", "error", fmt.Sprint(err), "interval", interval.String())
		return
	}
	t := time.NewTimer(min(interval, maxFirstCleanupDelay))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := a.Cleanup(ctx, c)
		switch {
		case err != nil && ctx.Err() != nil:
			return // stopped mid-run: not a failure
		case err != nil:
			a.metrics.runs.WithLabelValues("failed").Inc()
			log.ErrorContext(ctx, "outbox cleanup failed", "error", err.Error())
		default:
			a.metrics.runs.WithLabelValues("ok").Inc()
			if n > 0 {
				log.InfoContext(ctx, "outbox cleanup: delivered rows archived", "archived", n, "retention", c.Retention.String())
			}
		}
		t.Reset(interval)
	}
}

// check refuses settings under which a run could not make progress.
func (c Cleanup) check() error {
	if c.Retention <= 0 || c.BatchSize <= 0 || c.Pause < 0 {
		return fmt.Errorf("outbox cleanup: retention (%s) and batch size (%d) must be positive", c.Retention, c.BatchSize)
	}
	return nil
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
	if err := c.check(); err != nil {
		return 0, err
	}
	conn, err := a.pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("outbox cleanup: %w", err)
	}
	defer conn.Release()
	q := opsdb.New(conn)
	if locked, err := q.CleanupLock(ctx, cleanupLockKey); err != nil || !locked {
		return 0, err
	}
	defer func() {
		if _, err := q.CleanupUnlock(context.WithoutCancel(ctx), cleanupLockKey); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx)) // ending the session releases the lock
		}
	}()
	// Each batch is read in its index's order whatever the statistics say
	// (see opsdb.CleanupInIndexOrder), for this session until the run ends.
	if _, err := conn.Exec(ctx, opsdb.CleanupInIndexOrder); err != nil {
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
		rows, err := q.ArchiveDelivered(ctx, opsdb.ArchiveDeliveredParams{
			RetentionSeconds: c.Retention.Seconds(), AfterDeliveredAt: after, AfterEventID: afterID, BatchSize: int32(c.BatchSize),
		})
		if err != nil {
			return total, fmt.Errorf("outbox cleanup: archive a batch: %w", err)
		}
		n := int64(len(rows))
		total += n
		a.metrics.deleted.WithLabelValues("outbox").Add(float64(n))
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
	// Each batch starts at the last send time the one before it deleted.
	p := opsdb.DirectLogCleanupParams{SentBefore: time.Now().Add(-c.Retention), BatchSize: int32(c.BatchSize),
		SentFrom: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)}
	for {
		r, err := q.DirectLogCleanup(ctx, p)
		if err != nil {
			return total, fmt.Errorf("outbox cleanup: delete a batch of the direct log: %w", err)
		}
		p.SentFrom = r.LastSentAt
		n := r.Deleted
		total += n
		a.metrics.deleted.WithLabelValues("outbox_direct_log").Add(float64(n))
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
