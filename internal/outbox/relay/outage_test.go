package relay_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/relay"
)

// TestBrokerOutage (R3, R4): the broker rejects every produce for a while,
// then recovers. Each failure is an unknown outcome recorded in the row
// (attempts, class, text) with a backoff that doubles and that both relays
// honour, whichever of them failed the previous attempt. Nothing is lost.
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	const (
		produceTimeout = 250 * time.Millisecond
		base           = 300 * time.Millisecond
		capDelay       = 1200 * time.Millisecond
		clockSlack     = 50 * time.Millisecond // Go clock vs PostgreSQL clock on one host
	)
	e := setup(t)
	outage := e.Kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotEnoughReplicas, Count: -1})
	var evs []outbox.Event
	for i := range 20 {
		evs = append(evs, event(fmt.Sprintf("agg-%d", i), 1))
	}
	e.Insert(t, evs...)

	var log claimLog
	for _, owner := range []string{"a", "b"} {
		start(t, e.relay(t, func(c *relayConfig) {
			c.Owner = owner
			c.BatchSize = 5 // several claims per round, so both relays take part
			c.PollInterval = 20 * time.Millisecond
			c.ProduceTimeout = produceTimeout
			c.BackoffBase = base
			c.BackoffCap = capDelay
			c.Hooks = relay.Hooks{AfterClaim: log.hook(owner)}
		}))
	}
	require.Eventually(t, func() bool { return e.Count(t, "attempts < 3") == 0 }, 20*time.Second, 20*time.Millisecond,
		"every event failed three times")
	for _, r := range e.Rows(t) {
		require.Equal(t, "pending", r.State, "an unknown outcome is never marked sent")
		require.Equal(t, "timeout", *r.LastErrorClass)
		require.NotEmpty(t, *r.LastError)
		require.LessOrEqual(t, r.Attempts, 5, "backoff, not a retry storm")
	}
	outage.Remove()
	e.WaitDelivered(t, 10*time.Second)
	got := ids(e.ReadAll(t))
	for _, ev := range evs {
		require.Positive(t, got[ev.ID], "event %s delivered", ev.ID)
	}

	// Per event, in claim order: every claim respects the row's due time,
	// and each due time was pushed out by at least the lower bound of the
	// jittered backoff after the previous claim.
	byEvent := map[uuid.UUID][]claimSeen{}
	for _, c := range log.all() {
		byEvent[c.EventID] = append(byEvent[c.EventID], c)
	}
	crossed := 0
	for id, cs := range byEvent {
		slices.SortFunc(cs, func(a, b claimSeen) int { return a.at.Compare(b.at) })
		owners := map[string]bool{}
		for k, c := range cs {
			owners[c.owner] = true
			require.Equal(t, k, c.Attempts, "event %s claim %d", id, k)
			require.False(t, c.at.Before(c.NextAttemptAt.Add(-clockSlack)),
				"event %s claimed by %s at %s before its next_attempt_at %s", id, c.owner, c.at, c.NextAttemptAt)
			if k == 0 {
				continue
			}
			minDelay := min(base<<(k-1), capDelay) / 2 // lower edge of the jittered backoff
			require.GreaterOrEqual(t, c.NextAttemptAt.Sub(cs[k-1].at), minDelay-clockSlack,
				"event %s: retry %d due too early", id, k)
		}
		if len(owners) > 1 {
			crossed++
		}
	}
	require.Positive(t, crossed, "some events were retried by the other relay, which honoured the stored backoff")
}
