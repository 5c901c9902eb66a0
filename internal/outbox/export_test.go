package outbox

import "time"

// This file is compiled only into the package's own test binary. It gives
// the external tests (package outbox_test) the relay's crash points and a
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

// ClaimRounds reports how many claims the relay has made, so tests can wait
// for "the relay has looked again" instead of sleeping.
func (r *Relay) ClaimRounds() int64 { return r.rounds.Load() }

// Backoff exposes the retry delay for its unit test.
func Backoff(attempts int, base, max time.Duration) time.Duration {
	return backoff(attempts, base, max)
}

// BoundText exposes the last_error bound for its unit test.
var BoundText = boundText
