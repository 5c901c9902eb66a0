package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
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

// TestFenceSerializesWithTakeover: the confirm's fence cannot be raced
// (R2). A takeover of the row's partition is under way (its update of the
// lease row not yet committed) when the old owner's confirm runs. The
// confirm waits for it, then sees the new owner and epoch and matches
// nothing. Were the lease rows not locked by the confirm, it would read
// the epoch committed before the takeover, mark the row delivered, and the
// new owner would then read a row its predecessor had confirmed under its
// feet.
func TestFenceSerializesWithTakeover(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ev := e.Insert(t, event("raced", 1))[0]
	ctx := context.Background()
	q := outboxdb.New(e.DB.Pool)
	_, err := q.RelayPartitionsAcquire(ctx, outboxdb.RelayPartitionsAcquireParams{Owner: "old", LeaseSeconds: 60, MaxPartitions: 16})
	require.NoError(t, err)
	var part int32
	var epoch int64
	require.NoError(t, e.DB.Pool.QueryRow(ctx, `
		SELECT p.partition, p.epoch FROM outbox o JOIN outbox_relay_partition p ON p.partition = o.relay_partition
		WHERE o.event_id = $1`, ev.ID).Scan(&part, &epoch))

	takeover, err := e.DB.Pool.Begin(ctx)
	require.NoError(t, err)
	defer takeover.Rollback(ctx) //nolint:errcheck // no-op after commit
	_, err = takeover.Exec(ctx, "UPDATE outbox_relay_partition SET owner = 'new', epoch = epoch + 1 WHERE partition = $1", part)
	require.NoError(t, err)

	type result struct {
		ids []uuid.UUID
		err error
	}
	done := make(chan result, 1)
	go func() {
		ids, err := q.OutboxConfirm(ctx, outboxdb.OutboxConfirmParams{
			EventIDs: []uuid.UUID{ev.ID}, Partitions: []int32{0}, Offsets: []int64{1},
			FencePartitions: []int32{part}, FenceEpochs: []int64{epoch}, Owner: "old",
		})
		done <- result{ids, err}
	}()
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, e.DB.Pool.QueryRow(ctx, `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%name: OutboxConfirm%'`).Scan(&waiting))
		return waiting == 1
	}, 5*time.Second, 10*time.Millisecond, "the confirm waits for the takeover")
	require.NoError(t, takeover.Commit(ctx))

	res := recv(t, done, "the confirm")
	require.NoError(t, res.err)
	require.Empty(t, res.ids, "the confirm saw the new epoch and matched nothing")
	require.Equal(t, "pending", e.Row(t, ev.ID).State)
}
