package outbox

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Claim is one outbox row as leased by a relay: what hooks and logs see of
// it. The payload is deliberately absent.
type Claim struct {
	EventID          uuid.UUID
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	EventType        string
	SchemaVersion    int
	CreatedAt        time.Time
	// Attempts counts earlier delivery attempts; this one is Attempts+1.
	Attempts int
	// NextAttemptAt is the due time the row had when it was claimed.
	NextAttemptAt  time.Time
	LeaseToken     uuid.UUID
	LeaseExpiresAt time.Time
}

// Outcome is the broker's answer for one claimed event.
type Outcome struct {
	Claim
	// Partition and Offset are where the broker stored the record; set
	// when Err is nil.
	Partition int32
	Offset    int64
	// Err is nil when the broker acknowledged the record. Otherwise Class
	// says whether the row is retried or parked.
	Err   error
	Class ErrorClass
}

// Hooks are called at the points where a relay process can die with
// distinct consequences (V2). They are nil in production. A hook that
// returns an error makes Run return that error at once, leaving the
// database and the broker exactly as a crash at that point would: the claim
// transaction rolls back (window 1) or leases stay until they expire
// (windows 2-4), nothing is flushed or released.
//
// The third window, "the broker stored the record but its answer was lost",
// is produced by the broker (a fault answering REQUEST_TIMED_OUT after the
// append) and observed in AfterProduce as an Outcome with ClassTimeout.
type Hooks struct {
	// BeforeClaimCommit runs inside the claim transaction, after the rows
	// were leased and before COMMIT (window 1).
	BeforeClaimCommit func(ctx context.Context, claims []Claim) error
	// AfterClaim runs after the claim committed, before anything is sent
	// (window 2).
	AfterClaim func(ctx context.Context, claims []Claim) error
	// AfterProduce runs once the broker answered every record of the batch
	// (acknowledged, failed or timed out), before the confirm and the retry
	// bookkeeping (windows 3 and 4).
	AfterProduce func(ctx context.Context, outcomes []Outcome) error
	// AfterConfirm runs after the batch's rows were confirmed or released;
	// confirmed lists the events whose confirm matched their row (window 5).
	AfterConfirm func(ctx context.Context, confirmed []Claim) error
}

// hookError marks an error returned by a hook, which stops Run like a crash.
type hookError struct{ err error }

func (e *hookError) Error() string { return "outbox relay stopped by hook: " + e.err.Error() }
func (e *hookError) Unwrap() error { return e.err }

func callHook[T any](ctx context.Context, fn func(context.Context, []T) error, arg []T) error {
	if fn == nil {
		return nil
	}
	if err := fn(ctx, arg); err != nil {
		return &hookError{err: err}
	}
	return nil
}
