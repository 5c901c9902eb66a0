package relay

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxref/orders/internal/outbox/internal/pgtx"
)

// ownership is what the relay believes it owns: each partition of the
// aggregates with the epoch it took it at, and until when its leases
// certainly hold, on the relay's own clock. The belief may be stale (the
// database is the truth); the epoch fence makes acting on a stale belief
// harmless (see OutboxConfirm), and validUntil keeps the relay from
// reading once its leases may have passed to someone else (R5a).
type ownership struct {
	mu         sync.Mutex
	epochs     map[int32]int64
	validUntil time.Time // reads that cannot end by then are not started
	nextCheck  time.Time // when to run maintain again
	floor      time.Time // where reads start (OutboxReadFloor); zero: at the beginning
}

// snapshot returns the partitions owned with their epochs, and the read
// floor found for them, if the leases hold until at least end.
func (o *ownership) snapshot(end time.Time) (map[int32]int64, time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.epochs) == 0 || end.After(o.validUntil) {
		return nil, time.Time{}, false
	}
	return o.epochs, o.floor, true
}

// due reports whether maintain should run before the next read.
func (o *ownership) due(now time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !now.Before(o.nextCheck)
}

// set records the result of a maintain that began at began.
func (o *ownership) set(epochs map[int32]int64, validUntil, nextCheck, floor time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.epochs, o.validUntil, o.nextCheck, o.floor = epochs, validUntil, nextCheck, floor
}

// distrust stops reads until the next maintain, which is due at once:
// after a confirm that matched nothing (a partition was lost) or a
// maintain whose outcome is unknown.
func (o *ownership) distrust() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.validUntil, o.nextCheck = time.Time{}, time.Time{}
}

// owned returns the partitions owned, for logs and the stop.
func (o *ownership) owned() []int32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Sorted(maps.Keys(o.epochs))
}

// maintainEvery is how often the relay renews its leases and rebalances:
// every second (or poll interval, if longer), and at least four times per
// lease, so that a read always starts with at least three quarters of the
// lease left, more than the produce timeout (at most half of it). A relay
// that starts or stops is thus balanced within about a second.
func (r *Relay) maintainEvery() time.Duration {
	return min(max(r.cfg.PollInterval, time.Second), r.cfg.Lease/4)
}

// maintain runs the relay's ownership in one short transaction (R1): it
// says the relay is alive, renews the leases of the partitions it owns,
// and moves towards its fair share, ceil(partitions / live relays), by
// giving back the partitions above it or taking free and expired ones
// under a new epoch. It runs only between batches, when nothing is in
// flight, so a partition given back has no send of this relay pending.
//
// The transaction commits durably (unlike the confirms): a takeover lost
// in a database crash could otherwise be made again by another relay
// under the same epoch.
func (r *Relay) maintain(ctx context.Context) error {
	began := time.Now()
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	defer cancel()
	before := r.own.owned()
	owned := map[int32]int64{}
	var gave, took []int32
	err := pgtx.Run(mctx, r.cfg.Pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		hb, err := q.RelayHeartbeat(mctx, outboxdb.RelayHeartbeatParams{Owner: r.cfg.Owner, LeaseSeconds: r.cfg.Lease.Seconds()})
		if err != nil {
			return fmt.Errorf("record heartbeat: %w", err)
		}
		renewed, err := q.RelayPartitionsRenew(mctx, outboxdb.RelayPartitionsRenewParams{Owner: r.cfg.Owner, LeaseSeconds: r.cfg.Lease.Seconds()})
		if err != nil {
			return fmt.Errorf("renew partition leases: %w", err)
		}
		for _, p := range renewed {
			owned[p.Partition] = p.Epoch
		}
		share := int((hb.Partitions + hb.Live - 1) / max(hb.Live, 1))
		switch {
		case len(owned) > share:
			// The highest partitions go, so that relays agree on which
			// to keep without talking to each other.
			gave = slices.Sorted(maps.Keys(owned))[share:]
			if _, err := q.RelayPartitionsGiveBack(mctx, outboxdb.RelayPartitionsGiveBackParams{Owner: r.cfg.Owner, Partitions: gave}); err != nil {
				return fmt.Errorf("give back partitions above the fair share: %w", err)
			}
			for _, p := range gave {
				delete(owned, p)
			}
		case len(owned) < share:
			got, err := q.RelayPartitionsAcquire(mctx, outboxdb.RelayPartitionsAcquireParams{
				Owner: r.cfg.Owner, LeaseSeconds: r.cfg.Lease.Seconds(), MaxPartitions: int32(share - len(owned)),
			})
			if err != nil {
				return fmt.Errorf("take free partitions: %w", err)
			}
			for _, p := range got {
				owned[p.Partition] = p.Epoch
				took = append(took, p.Partition)
			}
			if len(got) > 0 {
				return r.beforeClaimCommit(mctx, nil)
			}
		}
		return nil
	})
	if err != nil {
		// A commit whose outcome is unknown may have given partitions
		// back: read nothing until a maintain succeeds.
		r.own.distrust()
		return fmt.Errorf("maintain relay partitions: %w", err)
	}
	r.own.set(owned, began.Add(r.cfg.Lease), began.Add(r.maintainEvery()), r.readFloor(ctx, owned))
	r.metrics.partitions.Set(float64(len(owned)))
	if len(took) > 0 || len(gave) > 0 || len(owned) != len(before) {
		r.log.InfoContext(ctx, "outbox relay partitions changed",
			"owned", slices.Sorted(maps.Keys(owned)), "taken", took, "given_back", gave)
	}
	return nil
}

// readFloorLag is how long an insert may stay uncommitted after it was
// written and still be read as soon as it commits, not one upkeep later
// (OutboxReadFloor). Reads step over the rows delivered in this window:
// a few seconds' worth, whatever the table's size.
const readFloorLag = 5 * time.Second

// readFloor finds where the reads of the partitions owned start until the
// next upkeep (OutboxReadFloor), after the upkeep's transaction committed,
// so that it covers partitions just taken. If it cannot, reads start at
// the beginning of the index: slower, never wrong.
func (r *Relay) readFloor(ctx context.Context, owned map[int32]int64) time.Time {
	if len(owned) == 0 {
		return time.Time{}
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	defer cancel()
	floor, err := outboxdb.OutboxReadFloorInIndexOrder(fctx, r.cfg.Pool, outboxdb.OutboxReadFloorParams{
		Partitions: slices.Sorted(maps.Keys(owned)), LateSeconds: r.floorLag.Seconds(),
	})
	if err != nil {
		r.log.WarnContext(fctx, "outbox relay: find where reads start; reading from the beginning until the next upkeep", "error", err)
		return time.Time{}
	}
	return floor
}

// giveBackAll hands every partition back and leaves the live set, once
// the last batch is settled (R9), so that the other relays take the
// partitions at once instead of waiting for the leases to expire.
func (r *Relay) giveBackAll(ctx context.Context) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	defer cancel()
	owned := r.own.owned()
	err := pgtx.Run(sctx, r.cfg.Pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		if _, err := q.RelayPartitionsGiveBack(sctx, outboxdb.RelayPartitionsGiveBackParams{Owner: r.cfg.Owner, Partitions: owned}); err != nil {
			return err
		}
		return q.RelayStop(sctx, r.cfg.Owner)
	})
	r.own.set(nil, time.Time{}, time.Time{}, time.Time{})
	r.metrics.partitions.Set(0)
	if err != nil {
		r.log.WarnContext(sctx, "give back partitions on stop; they pass to other relays when their leases expire",
			"error", err, "partitions", owned)
	}
}

// fence is the partitions of one batch with the epoch each was owned at
// when the batch was read: the condition of its confirm and release.
type fence struct {
	partitions []int32
	epochs     []int64
}

// fenceOf collects the fence of a batch's claims.
func fenceOf(claims []claim) fence {
	seen := map[int32]bool{}
	var f fence
	for _, c := range claims {
		if !seen[c.RelayPartition] {
			seen[c.RelayPartition] = true
			f.partitions = append(f.partitions, c.RelayPartition)
			f.epochs = append(f.epochs, c.Epoch)
		}
	}
	return f
}
