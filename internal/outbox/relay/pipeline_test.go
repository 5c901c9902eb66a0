package relay_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/relay"
)

// TestReadBesideTheBroker: under a backlog a batch is read while the one
// before it is with the broker, in the round trip and the transaction that
// confirm the one before that. The broker stage of the second batch is
// held until the third batch was read, which happens only if the two
// stages run at once. The third read must see the first batch's confirm:
// it returns the second versions of the first batch's aggregates, which
// the strict guard (R6) lets through only once their first versions are
// delivered, and not the second versions of the second batch's, whose
// first versions are with the broker. No read returns a row in flight,
// and every aggregate's versions reach the broker in order.
func TestReadBesideTheBroker(t *testing.T) {
	t.Parallel()
	const batch = 5
	e := setup(t)
	group := func(from, version int) []outbox.Event {
		evs := make([]outbox.Event, batch)
		for i := range evs {
			evs[i] = event(fmt.Sprintf("agg-%d", from+i), int64(version))
		}
		return evs
	}
	// One transaction per group, so that each group is due after the one
	// before it and a read of batch rows takes exactly one group.
	groups := [][]outbox.Event{group(0, 1), group(batch, 1), group(0, 2), group(batch, 2), group(2*batch, 1)}
	for _, g := range groups {
		e.Insert(t, g...)
		time.Sleep(2 * time.Millisecond)
	}

	var (
		mu       sync.Mutex
		reads    [][]relay.Claim
		produced int
		third    = make(chan struct{}) // closed once the third batch is read
	)
	start(t, e.relay(t, func(c *relayConfig) {
		c.BatchSize = batch
		c.Hooks.AfterClaim = func(_ context.Context, cs []relay.Claim) error {
			mu.Lock()
			defer mu.Unlock()
			reads = append(reads, cs)
			if len(reads) == 3 {
				close(third)
			}
			return nil
		}
		c.Hooks.AfterProduce = func(ctx context.Context, outs []relay.Outcome) error {
			mu.Lock()
			produced++
			second := produced == 2
			mu.Unlock()
			if second {
				select {
				case <-third:
				case <-time.After(10 * time.Second):
					return fmt.Errorf("the third batch was not read while the second was with the broker")
				}
			}
			return nil
		}
	}))
	select {
	case <-third:
	case <-time.After(15 * time.Second):
		t.Fatal("the third batch was not read while the second was with the broker")
	}
	e.WaitDelivered(t, 10*time.Second)

	mu.Lock()
	readOnce := map[uuid.UUID]bool{}
	for _, r := range reads {
		for _, c := range r {
			require.False(t, readOnce[c.EventID], "%s v%d read again while in flight", c.AggregateID, c.AggregateVersion)
			readOnce[c.EventID] = true
		}
	}
	for i, want := range groups[:3] {
		var got, wanted []string
		for _, c := range reads[i] {
			got = append(got, fmt.Sprintf("%s v%d", c.AggregateID, c.AggregateVersion))
		}
		for _, ev := range want {
			wanted = append(wanted, fmt.Sprintf("%s v%d", ev.AggregateID, ev.AggregateVersion))
		}
		require.ElementsMatch(t, wanted, got, "read %d", i+1)
	}
	mu.Unlock()

	want := map[string][]int64{}
	for _, g := range groups {
		for _, ev := range g {
			want[ev.AggregateID] = append(want[ev.AggregateID], ev.AggregateVersion)
		}
	}
	got := map[string][]int64{}
	for _, rec := range e.ReadAll(t) {
		got[rec.Key] = append(got[rec.Key], rec.Version)
	}
	require.Equal(t, want, got, "every aggregate's versions on the topic, in order")
}
