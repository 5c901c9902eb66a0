package outbox

import "time"

// ClaimRounds reports how many claims the relay has made, so tests can wait
// for "the relay has looked again" instead of sleeping.
func (r *Relay) ClaimRounds() int64 { return r.rounds.Load() }

// Backoff exposes the retry delay for its unit test.
func Backoff(attempts int, base, max time.Duration) time.Duration {
	return backoff(attempts, base, max)
}

// BoundText exposes the last_error bound for its unit test.
var BoundText = boundText
