package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox/relay"
)

// TestFencing: a relay whose partition lease expired while it was sending,
// and whose partition was taken over meanwhile, cannot confirm over the
// successor's send (R2). Its confirm matches no row, is counted as lost and
// is not retried; the row stays pending, its partition the successor's at
// a new epoch, until the successor confirms its own copy.
func TestFencing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ev := e.Insert(t, event("fenced", 1))[0]

	// The stale relay: its broker acknowledgement arrives, then it stalls
	// (GC pause, network partition) past its lease before confirming.
	staleAcked := make(chan struct{})
	staleGo := make(chan struct{})
	staleDone := make(chan []relay.Claim, 1)
	staleReg := prometheus.NewRegistry()
	var staleEpoch int64 // written before staleAcked is closed
	start(t, e.relay(t, func(c *relayConfig) {
		c.Owner = "stale"
		c.Lease = time.Second
		c.ProduceTimeout = 500 * time.Millisecond
		c.Registerer = staleReg
		c.Hooks = relay.Hooks{
			AfterProduce: func(ctx context.Context, os []relay.Outcome) error {
				if os[0].Err != nil { // not require: this runs on the relay's goroutine
					t.Errorf("stale relay's send failed: %v", os[0].Err)
				}
				staleEpoch = os[0].Epoch
				close(staleAcked)
				select { // stopping the relay (test failure) also unblocks it
				case <-staleGo:
				case <-ctx.Done():
				}
				return nil
			},
			AfterConfirm: func(_ context.Context, confirmed []relay.Claim) error {
				staleDone <- confirmed
				return nil
			},
		}
	}))
	recv(t, staleAcked, "the stale relay's send")
	require.Eventually(t, func() bool {
		return e.leaseOf(t, ev.ID).Expired
	}, 5*time.Second, 10*time.Millisecond, "the stale relay's lease expires")

	// The successor takes the partition under a new epoch and sends the
	// row too.
	succAcked := make(chan relay.Outcome, 1)
	succGo := make(chan struct{})
	start(t, e.relay(t, func(c *relayConfig) {
		c.Owner = "successor"
		c.Hooks = relay.Hooks{AfterProduce: func(ctx context.Context, os []relay.Outcome) error {
			if os[0].Err != nil {
				t.Errorf("successor's send failed: %v", os[0].Err)
			}
			succAcked <- os[0]
			select {
			case <-succGo:
			case <-ctx.Done():
			}
			return nil
		}}
	}))
	succClaim := recv(t, succAcked, "the successor's send")

	// Now the stale relay wakes up and confirms.
	close(staleGo)
	require.Empty(t, recv(t, staleDone, "the stale relay's confirm"), "the stale confirm matches no row")
	require.Equal(t, 1.0, metricValue(t, staleReg, "outbox_lost_confirms_total", map[string]string{"event_type": strictType}))

	r := e.Row(t, ev.ID)
	require.Equal(t, "pending", r.State, "the stale relay did not mark the successor's send delivered")
	l := e.leaseOf(t, ev.ID)
	require.Equal(t, "successor", *l.Owner, "the successor's lease is intact")
	require.Equal(t, succClaim.Epoch, l.Epoch)
	require.Greater(t, succClaim.Epoch, staleEpoch, "the takeover began a new epoch")
	require.Nil(t, r.Partition, "no stale partition/offset written")

	// The successor confirms its own copy.
	close(succGo)
	e.WaitDelivered(t, 5*time.Second)
	recs := e.ReadAll(t)
	require.Len(t, recs, 2, "both relays sent the event")
	require.Equal(t, recs[0].EventID, recs[1].EventID)
	r = e.Row(t, ev.ID)
	require.Equal(t, "delivered", r.State)
	require.Equal(t, recs[1].Offset, *r.Offset, "the row records the successor's copy")
}

// TestFencingRelease: the release is fenced like the confirm (R2). A relay
// whose send failed, and whose partition lease expired before it wrote the
// failure down, cannot park or reschedule a row that a successor, which
// took the partition over meanwhile, is sending: the successor's lease and
// its confirm stay intact, and no failure is recorded for an event that
// was delivered.
func TestFencingRelease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// Over the stale relay's client limit, so its send fails with a class
	// that parks; well within the successor's limit.
	ev := e.Insert(t, event("fenced", 1, withPayload(fmt.Sprintf(`{"n": 1, "blob": %q}`, strings.Repeat("y", 8000)))))[0]

	staleFailed := make(chan struct{})
	staleGo := make(chan struct{})
	staleDone := make(chan struct{})
	start(t, e.relay(t, func(c *relayConfig) {
		c.Owner = "stale"
		c.Lease = time.Second
		c.ProduceTimeout = 500 * time.Millisecond
		c.MaxMessageBytes = 4096
		c.Hooks = relay.Hooks{
			AfterProduce: func(ctx context.Context, os []relay.Outcome) error {
				if os[0].Class != relay.ClassMessageTooLarge { // not require: this runs on the relay's goroutine
					t.Errorf("stale relay's send: class %q (%v), want %s", os[0].Class, os[0].Err, relay.ClassMessageTooLarge)
				}
				close(staleFailed)
				select { // stopping the relay (test failure) also unblocks it
				case <-staleGo:
				case <-ctx.Done():
				}
				return nil
			},
			AfterConfirm: func(context.Context, []relay.Claim) error {
				close(staleDone)
				return nil
			},
		}
	}))
	recv(t, staleFailed, "the stale relay's failed send")
	require.Eventually(t, func() bool {
		return e.leaseOf(t, ev.ID).Expired
	}, 5*time.Second, 10*time.Millisecond, "the stale relay's lease expires")

	succAcked := make(chan relay.Outcome, 1)
	succGo := make(chan struct{})
	start(t, e.relay(t, func(c *relayConfig) {
		c.Owner = "successor"
		c.Hooks = relay.Hooks{AfterProduce: func(ctx context.Context, os []relay.Outcome) error {
			if os[0].Err != nil {
				t.Errorf("successor's send failed: %v", os[0].Err)
			}
			succAcked <- os[0]
			select {
			case <-succGo:
			case <-ctx.Done():
			}
			return nil
		}}
	}))
	succClaim := recv(t, succAcked, "the successor's send")

	// The stale relay wakes up and records its failure.
	close(staleGo)
	recv(t, staleDone, "the stale relay's confirm")
	r := e.Row(t, ev.ID)
	require.Equal(t, "pending", r.State, "the stale relay did not park the row the successor is sending")
	l := e.leaseOf(t, ev.ID)
	require.Equal(t, "successor", *l.Owner, "the successor's lease is intact")
	require.Equal(t, succClaim.Epoch, l.Epoch)
	require.Zero(t, r.Attempts, "no stale failure was counted")
	require.Nil(t, r.LastErrorClass)

	close(succGo)
	e.WaitDelivered(t, 5*time.Second)
	r = e.Row(t, ev.ID)
	require.Equal(t, "delivered", r.State)
	require.Len(t, e.ReadAll(t), 1, "only the successor's send reached the broker")
}
