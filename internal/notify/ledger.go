package notify

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/orders/internal/notify/notifydb"
)

// The email ledger's upkeep, apart from the sender that works through it:
// its gauges, the cleanup of finished rows, and an operator's resolution
// of an email whose fate is unknown or that failed.

// RefreshLedgerStats sets the ledger gauges from the table: the states
// still to be acted on (pending, sending, unknown, failed) counted exactly
// from their partial index, the finished ones (sent, skipped), nearly the
// whole ledger, estimated from the planner's statistics. It never reads
// the whole ledger, however long the retention.
func RefreshLedgerStats(ctx context.Context, db notifydb.DBTX, m *Metrics) error {
	q := notifydb.New(db)
	open, err := q.EmailSendCountOpen(ctx)
	if err != nil {
		return fmt.Errorf("count open ledger rows: %w", err)
	}
	finished, err := q.EmailSendEstimateFinished(ctx)
	if err != nil {
		return fmt.Errorf("estimate finished ledger rows: %w", err)
	}
	for _, st := range []string{StatePending, StateSending, StateSent, StateUnknown, StateFailed, StateSkipped} {
		m.Ledger.WithLabelValues(st).Set(0)
	}
	for _, r := range open {
		m.Ledger.WithLabelValues(r.State).Set(float64(r.N))
	}
	for _, r := range finished {
		m.Ledger.WithLabelValues(r.State).Set(float64(r.N))
	}
	return nil
}

// ledgerCleanupLockKey serialises ledger cleaners across instances (O6).
const ledgerCleanupLockKey = 7_215_402_115

// CleanupLedger deletes finished ledger rows (sent or skipped) older than
// ttl, batchSize rows per statement with a pause between batches, each
// batch starting past the last row the one before it deleted. One run
// at a time across instances: the run holds a session-level advisory lock
// on one connection throughout, and an instance that finds it taken returns
// at once. Unknown and failed rows are kept until an operator resolves
// them. The notifier uses the processed_event TTL: a redelivery older than
// that is a duplicate by version anyway, and no longer needs its ledger row
// to be recognised.
func CleanupLedger(ctx context.Context, pool *pgxpool.Pool, ttl time.Duration, batchSize int, pause time.Duration) (total int64, err error) {
	if batchSize <= 0 || ttl <= 0 || pause < 0 {
		return 0, fmt.Errorf("clean up finished emails: batch size (%d) and TTL (%s) must be positive", batchSize, ttl)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("clean up finished emails: %w", err)
	}
	defer conn.Release()
	q := notifydb.New(conn)
	if locked, err := q.EmailLedgerCleanupLock(ctx, ledgerCleanupLockKey); err != nil || !locked {
		return 0, err
	}
	defer func() {
		if _, err := q.EmailLedgerCleanupUnlock(context.WithoutCancel(ctx), ledgerCleanupLockKey); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx)) // ending the session releases the lock
		}
	}()
	// Each batch starts past the last email the one before it deleted (see
	// the query); the first one before every email.
	p := notifydb.EmailSendCleanupParams{TtlSeconds: ttl.Seconds(), BatchSize: int32(batchSize),
		AfterCreatedAt: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)}
	for {
		r, err := notifydb.New(indexOrder{db: conn}).EmailSendCleanup(ctx, p)
		if err != nil {
			return total, fmt.Errorf("clean up finished emails: %w", err)
		}
		p.AfterCreatedAt, p.AfterOperationKey = r.LastCreatedAt, r.LastOperationKey
		n := r.Deleted
		total += n
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

// ErrNotResolvable is returned by ResolveEmail for a row that is not
// unknown or failed.
var ErrNotResolvable = errors.New("email is not unknown or failed")

// Resolutions an operator can choose for an unknown or failed email.
const (
	ResolveSent   = "sent"   // confirmed delivered (for example in the relay's logs)
	ResolveResend = "resend" // send once more, with the same Message-ID
	ResolveFailed = "failed" // give up
)

// ResolveEmail records an operator's decision about an unknown or failed
// email, with the actor, and applies it. This is the hold policy's way out.
func ResolveEmail(ctx context.Context, db notifydb.DBTX, operationKey, resolution, actor string) error {
	state := map[string]string{ResolveSent: StateSent, ResolveResend: StatePending, ResolveFailed: StateFailed}[resolution]
	if state == "" {
		return fmt.Errorf("resolution %q: want sent, resend or failed", resolution)
	}
	if actor == "" {
		return errors.New("resolution needs an actor")
	}
	n, err := notifydb.New(db).EmailSendResolve(ctx, notifydb.EmailSendResolveParams{
		NewState: state, Actor: actor, Resolution: resolution, OperationKey: operationKey,
	})
	if err != nil {
		return fmt.Errorf("resolve email %s: %w", operationKey, err)
	}
	if n != 1 {
		return fmt.Errorf("resolve email %s: %w", operationKey, ErrNotResolvable)
	}
	return nil
}
