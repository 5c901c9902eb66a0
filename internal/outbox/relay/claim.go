package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
)

// claim reads up to BatchSize due rows of the partitions the relay owns
// (R1), skipping those of sending, the batch with the broker. It writes
// nothing: the partition leases are what keep other relays away from
// these rows, and each row carries the epoch of its partition, which
// fences its confirm. It reads nothing while the relay owns no partition,
// or when its leases might end before a send started now would (R5a).
//
// answered, if not nil, is the batch the broker answered last, which
// claim settles first. When the broker acknowledged every row of it, its
// confirm goes in the read's round trip and transaction
// (outboxdb.OutboxConfirmThenRead), and the read sees its rows as
// delivered. Otherwise it is settled on its own before the read, so that
// the rows it releases are not read again before their backoff.
func (r *Relay) claim(ctx context.Context, answered *sendResult, sending []leased) ([]leased, error) {
	if answered != nil && slices.ContainsFunc(answered.outcomes, func(o outcome) bool { return o.Err != nil }) {
		if _, err := r.confirm(*answered, nil); err != nil {
			return nil, err
		}
		answered = nil
	}
	start := time.Now()
	epochs, floor, ok := r.own.snapshot(start.Add(r.cfg.ProduceTimeout))
	if !ok {
		if answered != nil {
			_, err := r.confirm(*answered, nil)
			return nil, err
		}
		return nil, nil
	}
	parts := make([]int32, 0, len(epochs))
	for p := range epochs {
		parts = append(parts, p)
	}
	floor, skip := readFrom(floor, sending)
	read := outboxdb.OutboxReadParams{
		Partitions:       parts,
		ReadFloor:        floor,
		InFlight:         skip,
		IndependentTypes: r.types.Independent(),
		BatchSize:        int32(r.cfg.BatchSize),
	}
	if answered != nil {
		rows, err := r.confirm(*answered, &read)
		if err != nil {
			return nil, err
		}
		if _, _, ok := r.own.snapshot(start); !ok {
			// The confirm found a partition taken over (settle): send
			// nothing read under the old epochs until maintain has
			// found out which partitions are still the relay's.
			return nil, nil
		}
		return readBatch(rows, epochs), nil
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	defer cancel()
	rows, err := outboxdb.OutboxReadInIndexOrder(cctx, r.cfg.Pool, read)
	if err != nil {
		return nil, fmt.Errorf("read outbox batch: %w", err)
	}
	return readBatch(rows, epochs), nil
}

// readFrom returns where a read beside sending, the batch with the
// broker, starts, and the rows of it the read must skip.
//
// Beside a delivery (a backlog), the read starts at the latest row in
// flight rather than at the upkeep's floor. What it passes over is in
// flight, or versions that rows in flight hold back (the strict guard
// would skip them anyway), or rows that became due there since: all
// pending, so the next upkeep's floor, within about a second, is at or
// below them, and the drain that follows it, with nothing in flight, reads
// from there.
//
// Only the rows in flight at that start can be read again, so only they
// are skipped: under a backlog, the few that share the latest due time.
// The database checks each row the read walks against every id in the
// list, one by one: in the generic plan that a prepared statement settles
// on, the list is a parameter, which it does not hash. Passing every row
// in flight made a read at batch 500 cost hundreds of thousands of
// comparisons. The due time of a row in flight changes only when its batch
// is settled, after the broker answered it, and so never during this read.
//
// The list is never nil: pgx sends a nil slice as NULL, and a NULL list
// would make the read's NOT (event_id = ANY (...)) false for every row.
func readFrom(floor time.Time, sending []leased) (time.Time, []uuid.UUID) {
	for i := range sending {
		floor = later(floor, sending[i].NextAttemptAt)
	}
	skip := []uuid.UUID{}
	for i := range sending {
		if !sending[i].NextAttemptAt.Before(floor) {
			skip = append(skip, sending[i].EventID)
		}
	}
	return floor, skip
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// readBatch turns the rows a read returned, in read order, into the batch
// to send, each with its partition's epoch.
func readBatch(rows []outboxdb.OutboxReadRow, epochs map[int32]int64) []leased {
	batch := make([]leased, len(rows))
	for i, row := range rows {
		batch[i] = leased{
			claim: claim{
				EventID:          row.EventID,
				AggregateType:    row.AggregateType,
				AggregateID:      row.AggregateID,
				AggregateVersion: row.AggregateVersion,
				EventType:        row.EventType,
				SchemaVersion:    int(row.SchemaVersion),
				CreatedAt:        row.CreatedAt,
				Attempts:         int(row.Attempts),
				NextAttemptAt:    row.NextAttemptAt,
				RelayPartition:   row.RelayPartition,
				Epoch:            epochs[row.RelayPartition],
			},
			payload: row.Payload,
			mode:    row.PublishMode,
		}
		if row.Traceparent != nil {
			batch[i].traceparent = *row.Traceparent
		}
		if row.Tracestate != nil {
			batch[i].tracestate = *row.Tracestate
		}
	}
	return batch
}

// settle writes the outcome of one batch: a confirm of every acknowledged
// row (R2) and a release of every other row, retried or parked (R3-R5),
// both fenced by the epochs of the batch's partitions. It returns the
// claims whose confirm matched. With read set (claim sets it only when
// every row was acknowledged), the next batch is read in the confirm's
// round trip, and its rows are returned too.
func (r *Relay) settle(ctx context.Context, f fence, outcomes []outcome, read *outboxdb.OutboxReadParams) ([]claim, []outboxdb.OutboxReadRow, error) {
	confirm := outboxdb.OutboxConfirmParams{
		Owner: r.cfg.Owner, FencePartitions: f.partitions, FenceEpochs: f.epochs,
		EventIDs:   make([]uuid.UUID, 0, len(outcomes)),
		Partitions: make([]int32, 0, len(outcomes)),
		Offsets:    make([]int64, 0, len(outcomes)),
	}
	release := outboxdb.OutboxReleaseParams{Owner: r.cfg.Owner, FencePartitions: f.partitions, FenceEpochs: f.epochs}
	acked := make([]*outcome, 0, len(outcomes)) // the outcome of each confirm.EventIDs[i]
	var failed []*outcome
	for i := range outcomes {
		o := &outcomes[i]
		if o.Err == nil {
			acked = append(acked, o)
			confirm.EventIDs = append(confirm.EventIDs, o.EventID)
			confirm.Partitions = append(confirm.Partitions, o.Partition)
			confirm.Offsets = append(confirm.Offsets, o.Offset)
			continue
		}
		r.metrics.errors.WithLabelValues(o.EventType, string(o.Class)).Inc()
		failed = append(failed, o)
		state, delay := "pending", backoff(o.Attempts+1, r.cfg.BackoffBase, r.cfg.BackoffCap)
		switch {
		case o.Class.Parks():
			state, delay = "parked", 0
		case o.Class == ClassShutdown:
			delay = 0 // our own stop, not the broker's fault: hand over at once
		}
		release.EventIDs = append(release.EventIDs, o.EventID)
		release.States = append(release.States, state)
		release.ErrorClasses = append(release.ErrorClasses, string(o.Class))
		release.ErrorTexts = append(release.ErrorTexts, boundText(o.Err.Error()))
		release.DelaysSeconds = append(release.DelaysSeconds, delay.Seconds())
	}

	var confirmed []claim
	var rows []outboxdb.OutboxReadRow
	var errs []error
	lost := false
	defer func() {
		if lost {
			r.own.distrust() // a partition was taken over: find out which before reading again
		}
	}()
	if len(confirm.EventIDs) > 0 {
		var ids []uuid.UUID
		// The confirm commits without waiting for its WAL record to reach
		// the disk (synchronous_commit = off, for its transaction only,
		// which also skips waiting for synchronous standbys). Waiting for
		// the flush is most of the time this short statement takes, and what a database crash or a
		// failover can lose by not waiting is harmless here: the confirms of the
		// final fraction of a second. A lost confirm leaves its rows pending, and
		// the partition's owner sends them again with the same event_id, a
		// duplicate that consumers absorb, and never a loss. Order holds too: the
		// WAL is written in order, so a confirm that survived the crash implies
		// that every confirm committed before it survived too, and a later version
		// is never left delivered while the earlier one's delivery was forgotten.
		// The taking of partitions commits durably (see maintain), and the
		// business transaction that writes the rows keeps the server's setting:
		// an event that was acknowledged to the caller must not vanish.
		//
		// With a read, the read's transaction is the confirm's: if the
		// read fails, so does the confirm.
		err := retrySafe(ctx, func() (err error) {
			if read != nil {
				ids, rows, err = outboxdb.OutboxConfirmThenRead(ctx, r.cfg.Pool, confirm, *read)
			} else {
				ids, err = outboxdb.OutboxConfirmRelaxed(ctx, r.cfg.Pool, confirm)
			}
			return err
		})
		if err != nil {
			// The rows stay pending and are read and sent again: a
			// duplicate, never a loss.
			what := "confirm %d delivered outbox events: %w"
			if read != nil {
				what = "confirm %d delivered outbox events and read the next batch: %w"
			}
			errs = append(errs, fmt.Errorf(what, len(confirm.EventIDs), err))
		} else {
			matched := make(map[uuid.UUID]bool, len(ids))
			for _, id := range ids {
				matched[id] = true
			}
			// The per-event line is built only when it is written: its
			// attributes cost a handful of allocations per event, which
			// adds up at thousands of events a second.
			debug := r.log.Enabled(ctx, slog.LevelDebug)
			for _, o := range acked {
				if matched[o.EventID] {
					confirmed = append(confirmed, o.claim)
					if debug {
						r.log.DebugContext(o.logContext(ctx), "outbox event delivered", outcomeAttrs(o)...)
					}
					continue
				}
				r.metrics.lostConfirms.WithLabelValues(o.EventType).Inc()
				r.log.WarnContext(o.logContext(ctx), "outbox confirm matched no row: the lease was lost and another relay owns the event's partition; it will be sent again",
					outcomeAttrs(o)...)
				lost = true
			}
		}
	}

	if len(release.EventIDs) > 0 {
		var ids []uuid.UUID
		err := retrySafe(ctx, func() (err error) {
			ids, err = outboxdb.OutboxReleaseCustomPlan(ctx, r.cfg.Pool, release)
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("release %d failed outbox events: %w", len(release.EventIDs), err))
		} else {
			r.logFailures(ctx, failed, ids)
		}
	}
	if len(errs) > 0 {
		return confirmed, nil, fmt.Errorf("settle outbox batch: %w", errors.Join(errs...))
	}
	return confirmed, rows, nil
}

// logFailures logs parked events one by one (they need an operator) and
// transient failures as one summary per batch, so that a broker outage
// does not turn into a log storm.
func (r *Relay) logFailures(ctx context.Context, failed []*outcome, released []uuid.UUID) {
	matched := make(map[uuid.UUID]bool, len(released))
	for _, id := range released {
		matched[id] = true
	}
	byClass := map[ErrorClass]int{}
	var sample *outcome
	for _, o := range failed {
		attrs := append(outcomeAttrs(o), "error_class", string(o.Class))
		switch {
		case !matched[o.EventID]:
			r.own.distrust()
			r.log.InfoContext(o.logContext(ctx), "outbox release matched no row: the lease was lost and another relay owns the event's partition", attrs...)
		case o.Class.Parks():
			r.log.ErrorContext(o.logContext(ctx), "outbox event parked: it fails the same way on every attempt and waits for repair", append(attrs, "reason", o.Err.Error())...)
		default:
			byClass[o.Class]++
			if sample == nil {
				sample = o
			}
			r.log.DebugContext(o.logContext(ctx), "outbox event send failed; retrying after backoff", append(attrs, "error", o.Err)...)
		}
	}
	if sample != nil {
		counts := make([]any, 0, 2*len(byClass))
		for c, n := range byClass {
			counts = append(counts, string(c), n)
		}
		r.log.WarnContext(ctx, "outbox events not delivered; retrying after backoff",
			"failed", len(failed), slog.Group("by_class", counts...), "sample_event_id", sample.EventID, "sample_error", sample.Err)
	}
}

// outcomeAttrs are the log attributes of one event (O2): identifiers and
// broker position, never the payload.
func outcomeAttrs(o *outcome) []any {
	attrs := []any{
		"event_id", o.EventID,
		"event_type", o.EventType,
		"aggregate_type", o.AggregateType,
		"aggregate_id", o.AggregateID,
		"aggregate_version", o.AggregateVersion,
		"attempt", o.Attempts + 1,
	}
	if o.Err == nil {
		attrs = append(attrs, "partition", o.Partition, "offset", o.Offset)
	}
	return attrs
}

// retrySafe runs fn up to three times, but retries only errors that pgx
// reports as raised before the statement reached the server. Retrying
// anything else could run a confirm twice, and the second run would match
// nothing and be misreported as a lost lease.
func retrySafe(ctx context.Context, fn func() error) error {
	for i := 0; ; i++ {
		err := fn()
		if err == nil || i == 2 || !pgconn.SafeToRetry(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(100<<i) * time.Millisecond):
		}
	}
}
