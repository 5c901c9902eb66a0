package orders

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/orders/internal/orders/ordersdb"
)

// cleanupLockKey serialises the idempotency-key cleanups of every orders
// process (O6).
const cleanupLockKey = 7_215_402_117

// KeyCleanup deletes idempotency keys past their retention (S3, O6): a key
// only has to outlive the retries of the request that used it.
type KeyCleanup struct {
	pool    *pgxpool.Pool
	deleted *prometheus.CounterVec
}

// NewKeyCleanup returns the cleanup over pool. Register Collector with the
// service's metrics registry.
func NewKeyCleanup(pool *pgxpool.Pool) *KeyCleanup {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orders_cleanup_deleted_total",
		Help: "Rows deleted by the orders service's retention cleanup, by table.",
	}, []string{"table"})
	c.WithLabelValues("idempotency_keys")
	return &KeyCleanup{pool: pool, deleted: c}
}

// Collector returns the cleanup's metrics (orders_cleanup_deleted_total).
func (k *KeyCleanup) Collector() prometheus.Collector { return k.deleted }

// Run deletes keys older than retention, batchSize per statement, oldest
// first, with a pause between batches, and returns how many it deleted.
// Each batch starts past the last key the one before it deleted. One run at a time across processes: it holds a session-level advisory
// lock for the whole run and returns 0 at once when another run has it.
// Deleting a key only stops a very late retry from being recognised; the
// order it created stays.
func (k *KeyCleanup) Run(ctx context.Context, retention time.Duration, batchSize int, pause time.Duration) (total int64, err error) {
	if retention <= 0 || batchSize <= 0 || pause < 0 {
		return 0, fmt.Errorf("idempotency key cleanup: retention (%s) and batch size (%d) must be positive", retention, batchSize)
	}
	conn, err := k.pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("idempotency key cleanup: %w", err)
	}
	defer conn.Release()
	q := ordersdb.New(conn)
	if locked, err := q.CleanupLock(ctx, cleanupLockKey); err != nil || !locked {
		return 0, err
	}
	defer func() {
		if _, err := q.CleanupUnlock(context.WithoutCancel(ctx), cleanupLockKey); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx)) // ending the session releases the lock
		}
	}()
	// Each batch starts past the last key the one before it deleted (see
	// the query); the first one before every key.
	p := ordersdb.IdempotencyKeysCleanupParams{RetentionSeconds: retention.Seconds(), BatchSize: int32(batchSize),
		AfterCreatedAt: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)}
	for {
		r, err := q.IdempotencyKeysCleanup(ctx, p)
		if err != nil {
			return total, fmt.Errorf("idempotency key cleanup: %w", err)
		}
		p.AfterCreatedAt, p.AfterCustomer, p.AfterKey = r.LastCreatedAt, r.LastCustomer, r.LastKey
		n := r.Deleted
		total += n
		k.deleted.WithLabelValues("idempotency_keys").Add(float64(n))
		if n < int64(batchSize) {
			return total, nil
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(pause):
		}
	}
}
