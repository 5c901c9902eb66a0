package relay

import (
	"context"
	"fmt"
	"time"
)

// This file is compiled only into the package's own test binary. It gives
// the external tests (package relay_test) the relay's crash points and a
// few internals, without making any of them part of the package's API.

// Hooks, Claim and Outcome are the crash-point hooks and what they see
// (hooks.go), for the crash-window, fencing and shutdown tests.
type (
	Hooks   = hooks
	Claim   = claim
	Outcome = outcome
)

// NewRelayWithHooks is NewRelay with hooks installed before Run can start,
// so the hooks are never written while the relay reads them.
func NewRelayWithHooks(cfg Config, h Hooks) (*Relay, error) {
	r, err := NewRelay(cfg)
	if err != nil {
		return nil, err
	}
	r.hooks = h
	return r, nil
}

// SetReadFloorLag changes readFloorLag for one relay, before Run.
func (r *Relay) SetReadFloorLag(d time.Duration) { r.floorLag = d }

// ReadFloor is where the relay's reads start until its next upkeep
// (OutboxReadFloor); zero before the first.
func (r *Relay) ReadFloor() time.Time {
	r.own.mu.Lock()
	defer r.own.mu.Unlock()
	return r.own.floor
}

// ClaimRounds reports how many claims the relay has made, so tests can wait
// for "the relay has looked again" instead of sleeping.
func (r *Relay) ClaimRounds() int64 { return r.rounds.Load() }

// SetRefresh changes how often the collector reads the table
// (DefaultStatsRefresh in production), so a test can hold one read for
// good or make the next scrape read again.
func (c *StatsCollector) SetRefresh(every time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.every = every
}

// Backoff exposes the retry delay for its unit test.
func Backoff(attempts int, base, max time.Duration) time.Duration {
	return backoff(attempts, base, max)
}

// BoundText exposes the last_error bound for its unit test.
var BoundText = boundText

// ClaimAndConfirm is one round of the relay's database work with no broker:
// the partitions' upkeep when it is due, the relay's own read, then its
// fenced confirm of every row read at made-up broker positions. The drain
// benchmark compares the relay against a loop of it, which is the most the
// relay could reach if sending cost nothing. It returns how many rows the
// read returned.
func (r *Relay) ClaimAndConfirm(ctx context.Context) (int, error) {
	if r.own.due(time.Now()) {
		if err := r.maintain(ctx); err != nil {
			return 0, err
		}
	}
	batch, err := r.claim(ctx, nil, nil)
	if err != nil || len(batch) == 0 {
		return 0, err
	}
	outcomes := make([]outcome, len(batch))
	for i := range batch {
		outcomes[i].claim = batch[i].claim
		outcomes[i].Partition, outcomes[i].Offset = int32(i%6), int64(i)
	}
	confirmed, _, err := r.settle(ctx, fenceOf(claimsOf(batch)), outcomes, nil)
	if err == nil && len(confirmed) != len(batch) {
		err = fmt.Errorf("confirmed %d of %d read rows", len(confirmed), len(batch))
	}
	return len(batch), err
}
