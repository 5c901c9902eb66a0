package relay_test

import (
	"context"
	"errors"
	"fmt"
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

var errCrash = errors.New("simulated crash")

// TestCrashWindows kills a relay at each of the five distinct windows of
// V2 and starts a successor with a new owner. In every case the successor
// delivers everything at least once, and any re-send carries the same
// event_id and version.
func TestCrashWindows(t *testing.T) {
	t.Parallel()

	// The first relay's lease; a successor waits at most this long.
	const lease = 2 * time.Second

	// Four aggregates at version 1 (all in the crashing batch) and one
	// version 2 that the strict guard holds back until its head is
	// delivered, so the successor has work beyond the crashed batch.
	fixture := func(t *testing.T, e *env) []outbox.Event {
		var evs []outbox.Event
		for i := range 4 {
			evs = append(evs, event(fmt.Sprintf("agg-%d", i), 1))
		}
		evs = append(evs, event("agg-0", 2))
		return e.Insert(t, evs...)
	}
	first := func(t *testing.T, e *env, hooks relay.Hooks) *running {
		return start(t, e.relay(t, func(c *relayConfig) {
			c.Owner = "first"
			c.Lease = lease
			c.ProduceTimeout = lease / 2
			c.Hooks = hooks
		}))
	}
	successor := func(t *testing.T, e *env) *running {
		return start(t, e.relay(t, func(c *relayConfig) { c.Owner = "successor" }))
	}
	// checkDelivered verifies the end state: every row delivered by the
	// successor, at the position of its last copy, every copy on the
	// broker with the row's event_id and version.
	checkDelivered := func(t *testing.T, e *env, evs []outbox.Event) []record {
		e.WaitDelivered(t, 15*time.Second)
		recs := e.ReadAll(t)
		rows := e.Rows(t)
		last := map[uuid.UUID]record{}
		for _, r := range recs {
			row, ok := rows[r.EventID]
			require.True(t, ok, "record %s has no outbox row", r.EventID)
			require.Equal(t, row.Version, r.Version, "a re-send keeps the version")
			last[r.EventID] = r
		}
		for _, ev := range evs {
			r, ok := last[ev.ID]
			require.True(t, ok, "event %s never reached the broker", ev.ID)
			row := rows[ev.ID]
			require.Equal(t, "delivered", row.State)
			require.Equal(t, r.Partition, *row.Partition)
			require.Equal(t, r.Offset, *row.Offset, "the row points at the copy the successor confirmed")
		}
		return recs
	}

	t.Run("BeforeClaimCommit", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		evs := fixture(t, e)
		// A long lease here, so that "the successor did not wait for it"
		// holds by a wide margin on a loaded machine.
		const long = time.Minute
		r := start(t, e.relay(t, func(c *relayConfig) {
			c.Owner = "first"
			c.Lease = long
			c.Hooks = relay.Hooks{BeforeClaimCommit: func(context.Context, []relay.Claim) error { return errCrash }}
		}))
		require.ErrorIs(t, r.Wait(t), errCrash)

		// The taking of partitions rolled back: the crashed relay owns
		// none, so the successor does not wait for any lease.
		require.Zero(t, e.owned(t, "first"))
		require.Empty(t, e.ReadAll(t))
		began := time.Now()
		successor(t, e)
		recs := checkDelivered(t, e, evs)
		require.Less(t, time.Since(began), long/2, "nothing was leased, so nothing to wait for")
		for id, n := range ids(recs) {
			require.Equal(t, 1, n, "event %s sent once", id)
		}
	})

	t.Run("AfterClaimBeforeSend", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		evs := fixture(t, e)
		r := first(t, e, relay.Hooks{AfterClaim: func(context.Context, []relay.Claim) error { return errCrash }})
		require.ErrorIs(t, r.Wait(t), errCrash)

		require.Equal(t, len(evs), e.heldBy(t, "first"), "the crashed relay's partition leases stay")
		require.Empty(t, e.ReadAll(t), "nothing was sent")
		successor(t, e)
		recs := checkDelivered(t, e, evs)
		for id, n := range ids(recs) {
			require.Equal(t, 1, n, "event %s sent once", id)
		}
	})

	t.Run("StoredButAnswerLost", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		// The broker appends each record, then answers REQUEST_TIMED_OUT:
		// the relay cannot know the record is stored.
		fault := e.Kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.RequestTimedOut, Count: -1})
		evs := fixture(t, e)
		var seen []relay.Outcome
		r := first(t, e, relay.Hooks{AfterProduce: func(_ context.Context, os []relay.Outcome) error {
			seen = os
			return errCrash
		}})
		require.ErrorIs(t, r.Wait(t), errCrash)
		fault.Remove()

		require.Len(t, seen, 4)
		for _, o := range seen {
			require.Error(t, o.Err, "the answer was lost")
			require.Equal(t, relay.ClassTimeout, o.Class)
		}
		stored := ids(e.ReadAll(t))
		for _, ev := range evs[:4] {
			require.Equal(t, 1, stored[ev.ID], "the broker stored %s although its answer was lost", ev.ID)
		}
		require.Equal(t, len(evs), e.heldBy(t, "first"), "the crashed relay's partition leases stay")

		successor(t, e)
		recs := checkDelivered(t, e, evs)
		got := ids(recs)
		for _, ev := range evs[:4] {
			require.Equal(t, 2, got[ev.ID], "re-sent once with the same event_id")
		}
	})

	t.Run("AckedBeforeConfirm", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		evs := fixture(t, e)
		r := first(t, e, relay.Hooks{AfterProduce: func(_ context.Context, os []relay.Outcome) error {
			for _, o := range os {
				if o.Err != nil {
					return nil // not this window; the successor copes anyway
				}
			}
			return errCrash
		}})
		require.ErrorIs(t, r.Wait(t), errCrash)

		require.Len(t, e.ReadAll(t), 4, "the broker acknowledged the batch")
		require.Equal(t, len(evs), e.heldBy(t, "first"), "but no row was confirmed")
		successor(t, e)
		recs := checkDelivered(t, e, evs)
		got := ids(recs)
		for _, ev := range evs[:4] {
			require.Equal(t, 2, got[ev.ID], "duplicate with the same event_id")
		}
		// Both copies of an event sit in the same partition, in order.
		first := map[uuid.UUID]record{}
		for _, rec := range recs {
			if f, ok := first[rec.EventID]; ok {
				require.Equal(t, f.Partition, rec.Partition)
				require.Greater(t, rec.Offset, f.Offset)
			} else {
				first[rec.EventID] = rec
			}
		}
	})

	t.Run("AfterConfirm", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		evs := fixture(t, e)
		r := first(t, e, relay.Hooks{AfterConfirm: func(_ context.Context, cs []relay.Claim) error {
			if len(cs) == 0 {
				return nil // every send failed (a slow machine): not this window
			}
			return errCrash
		}})
		require.ErrorIs(t, r.Wait(t), errCrash)

		require.Equal(t, 4, e.Count(t, "state = 'delivered'"))
		s := successor(t, e)
		recs := checkDelivered(t, e, evs)
		// Let the successor look a few more times: nothing is re-sent.
		rounds := s.Relay.ClaimRounds()
		require.Eventually(t, func() bool { return s.Relay.ClaimRounds() > rounds+3 }, 5*time.Second, 10*time.Millisecond)
		recs = e.ReadAll(t)
		require.Len(t, recs, len(evs))
		for id, n := range ids(recs) {
			require.Equal(t, 1, n, "event %s sent once", id)
		}
	})
}
