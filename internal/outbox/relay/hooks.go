package relay

import (
	"context"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"
)

// claim is one outbox row as read by a relay: what logs and the crash
// points see of it. The payload is deliberately absent.
type claim struct {
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
	NextAttemptAt time.Time
	// RelayPartition is the row's partition of the aggregates, and Epoch
	// the partition's epoch when the relay read the row: the fence of its
	// confirm.
	RelayPartition int32
	Epoch          int64
}

// outcome is the broker's answer for one claimed event.
type outcome struct {
	claim
	// Partition and Offset are where the broker stored the record; set
	// when Err is nil.
	Partition int32
	Offset    int64
	// Err is nil when the broker acknowledged the record. Otherwise Class
	// says whether the row is retried or parked.
	Err   error
	Class ErrorClass
	// span is the event's produce span, nil when it was not sent; its
	// context puts the event's trace ids in the logs about it.
	span trace.Span
}

// hooks are called at the points where a relay process can die with
// distinct consequences (V2). Only the package's tests set them (through
// export_test.go); they are nil in every built binary. A hook that returns
// an error makes Run return that error at once, leaving the database and
// the broker exactly as a crash at that point would: the taking of
// partitions rolls back (window 1) or the partitions' leases stay until
// they expire (windows 2-5), nothing is flushed, released or given back.
//
// The third window, "the broker stored the record but its answer was lost",
// is produced by the broker (a fault answering REQUEST_TIMED_OUT after the
// append) and observed in AfterProduce as an outcome with ClassTimeout.
type hooks struct {
	// BeforeClaimCommit runs inside the transaction that takes partitions
	// for the relay, after it took at least one and before COMMIT (window
	// 1). No row has been read yet, so claims is empty.
	BeforeClaimCommit func(ctx context.Context, claims []claim) error
	// AfterClaim runs after a batch was read from the relay's partitions,
	// before anything is sent (window 2).
	AfterClaim func(ctx context.Context, claims []claim) error
	// AfterProduce runs once the broker answered every record of the batch
	// (acknowledged, failed or timed out), before the confirm and the retry
	// bookkeeping (windows 3 and 4).
	AfterProduce func(ctx context.Context, outcomes []outcome) error
	// AfterConfirm runs after the batch's rows were confirmed or released;
	// confirmed lists the events whose confirm matched their row (window 5).
	AfterConfirm func(ctx context.Context, confirmed []claim) error
}

// The crash points. Each window of V2 is one small named function, called
// at exactly one place in the relay, so that whatever stops the relay
// there (the package tests' hooks, and the failpoints that kill a real
// relay process in builds with the "failpoints" tag) is added in one spot
// and cannot drift from the others.

// beforeClaimCommit is window 1: partitions taken, the transaction that
// takes them not yet committed.
func (r *Relay) beforeClaimCommit(ctx context.Context, batch []leased) error {
	failpoint("relay/before-claim-commit")
	if r.hooks.BeforeClaimCommit == nil {
		return nil
	}
	return callHook(ctx, r.hooks.BeforeClaimCommit, claimsOf(batch))
}

// afterClaim is window 2: a batch read from partitions the relay owns,
// nothing sent.
func (r *Relay) afterClaim(ctx context.Context, batch []leased) error {
	failpoint("relay/after-claim")
	if r.hooks.AfterClaim == nil {
		return nil
	}
	return callHook(ctx, r.hooks.AfterClaim, claimsOf(batch))
}

// afterProduce is windows 3 and 4: the broker answered (or stored the
// record and the answer was lost), nothing confirmed.
func (r *Relay) afterProduce(ctx context.Context, outcomes []outcome) error {
	failpoint("relay/after-produce")
	return callHook(ctx, r.hooks.AfterProduce, outcomes)
}

// afterConfirm is window 5: the batch is settled in the database.
func (r *Relay) afterConfirm(ctx context.Context, confirmed []claim) error {
	failpoint("relay/after-confirm")
	return callHook(ctx, r.hooks.AfterConfirm, confirmed)
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

func claimsOf(batch []leased) []claim {
	out := make([]claim, len(batch))
	for i := range batch {
		out[i] = batch[i].claim
	}
	return out
}
