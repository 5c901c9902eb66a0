package relay

import "time"

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
