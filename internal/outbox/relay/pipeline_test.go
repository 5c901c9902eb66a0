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

// TestThreeBatchesInFlight: under a backlog a batch is read while the one
// before it is with the broker and the one before that is being confirmed.
// The first batch's confirm is held before it commits (a row lock the test
// takes once the broker answered the batch) until the third batch was read
// and the second answered, which happens only if the three stages run at
// once. No read returns a row in flight, neither later read returns the
// second version of an aggregate whose first version is still unconfirmed
// (R6), and every aggregate's versions reach the broker in order.
func TestThreeBatchesInFlight(t *testing.T) {
	t.Parallel()
	const batch = 5
	e := setup(t)
	var evs []outbox.Event
	for v := int64(1); v <= 2; v++ {
		for i := range 4 * batch {
			evs = append(evs, event(fmt.Sprintf("agg-%d", i), v))
		}
	}
	e.Insert(t, evs...)

	var (
		mu       sync.Mutex
		reads    [][]relay.Claim
		produced int
		third    = make(chan struct{}) // closed once the third batch is read and the second answered
	)
	ready := func() { // with mu held
		if len(reads) >= 3 && produced >= 2 {
			select {
			case <-third:
			default:
				close(third)
			}
		}
	}
	// hold locks one row of the first batch, so that its confirm waits
	// before it commits, until the third read or 15 seconds.
	hold := func(ctx context.Context, id uuid.UUID) error {
		tx, err := e.DB.Pool.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT 1 FROM outbox WHERE event_id = $1 FOR UPDATE", id); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		go func() {
			select {
			case <-third:
			case <-time.After(15 * time.Second):
			}
			_ = tx.Rollback(context.Background())
		}()
		return nil
	}
	start(t, e.relay(t, func(c *relayConfig) {
		c.BatchSize = batch
		c.Hooks.AfterClaim = func(_ context.Context, cs []relay.Claim) error {
			mu.Lock()
			defer mu.Unlock()
			reads = append(reads, cs)
			ready()
			return nil
		}
		c.Hooks.AfterProduce = func(ctx context.Context, outs []relay.Outcome) error {
			mu.Lock()
			produced++
			first := produced == 1
			ready()
			mu.Unlock()
			if first {
				return hold(context.WithoutCancel(ctx), outs[0].EventID)
			}
			return nil
		}
	}))
	select {
	case <-third:
	case <-time.After(10 * time.Second):
		t.Fatal("the third batch was not read, or the second not answered, while the first was being confirmed")
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
	first := map[string]bool{}
	for _, c := range reads[0] {
		first[c.AggregateID] = true
	}
	for _, r := range reads[1:3] {
		for _, c := range r {
			require.False(t, c.AggregateVersion == 2 && first[c.AggregateID],
				"%s v2 was read while v1 was in flight", c.AggregateID)
		}
	}
	mu.Unlock()

	got := map[string][]int64{}
	for _, rec := range e.ReadAll(t) {
		got[rec.Key] = append(got[rec.Key], rec.Version)
	}
	require.Len(t, got, 4*batch)
	for agg, vs := range got {
		require.Equal(t, []int64{1, 2}, vs, "versions of %s on the topic", agg)
	}
}
