package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// relayWindow runs one crash window of the relay (V2) with real processes.
// The orders API commits its commands with its own relay off, so the whole
// backlog waits in the outbox; then `orders relay`, armed with the
// failpoint, claims it and dies inside the window by SIGKILL; a successor
// relay without failpoints takes over. A notifier consumes throughout.
// during, if set, runs before the dying relay starts and returns what
// undoes it once that relay is dead. relayWindow returns how many times
// each event is on the topic, the events the dead relay had sent and not
// confirmed, and how many partitions it still held when it died.
func relayWindow(t *testing.T, failpoint string, during func(c *chain) (undo func())) (copies map[uuid.UUID]int, leased map[uuid.UUID]bool, held int) {
	t.Helper()
	c := newChain(t, map[string]string{"RELAY_ENABLED": "false"})
	notifier := start(t, "notifier", c.notifierEnv(nil), "serve")
	waitReady(t, notifier, "http://"+c.notifierAddr+"/readyz")
	ids := c.commands(t)

	relayEnv := ordersEnv(c.odb, c.ordersAddr, c.broker)
	relayEnv["RELAY_METRICS_ADDR"] = freeAddr(t)
	dyingEnv := map[string]string{"FAILPOINTS": failpoint}
	for k, v := range relayEnv {
		dyingEnv[k] = v
	}
	undo := func() {}
	if during != nil {
		undo = during(c)
	}
	dying := start(t, "orders", dyingEnv, "relay")
	waitKilled(t, dying)
	undo()
	leased = leasedRows(t, c)
	held = heldPartitions(t, c)

	successor := start(t, "orders", relayEnv, "relay")
	_ = successor
	require.Zero(t, c.checkOutcome(t, ids))
	require.Zero(t, c.undelivered(t), "every committed event is delivered")

	want := map[uuid.UUID]bool{}
	for _, r := range outboxRows(t, c.odb.Pool) {
		want[r.eventID] = true
	}
	copies = map[uuid.UUID]int{}
	for _, rec := range readTopic(t, c.broker, want) {
		copies[uuid.MustParse(rec.headers["ce_id"])]++
	}
	t.Logf("%s: %d events, %d in flight in the dead relay, %d partitions held by it, %d records on the topic, %v duplicates absorbed by the notifier",
		failpoint, len(want), len(leased), held, sum(copies), metricSum(t, "http://"+c.notifierAddr+"/metrics", "inbox_duplicates_total"))
	return copies, leased, held
}

func sum(m map[uuid.UUID]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// leasedRows lists the rows a relay had in flight when it died or froze
// (no other relay runs at that moment): sent, since they are on the topic,
// and not confirmed, since they are still pending. The relay writes
// nothing on a row before its confirm, so the topic is where they show.
func leasedRows(t *testing.T, c *chain) map[uuid.UUID]bool {
	t.Helper()
	rows, err := c.odb.Pool.Query(context.Background(), "SELECT event_id FROM outbox WHERE state = 'pending'")
	require.NoError(t, err)
	pending, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(t, err)
	sent := map[uuid.UUID]bool{}
	for _, rec := range readTopicToEnd(t, c.broker) {
		if id, err := uuid.Parse(rec.headers["ce_id"]); err == nil {
			sent[id] = true
		}
	}
	out := map[uuid.UUID]bool{}
	for _, id := range pending {
		if sent[id] {
			out[id] = true
		}
	}
	return out
}

// heldPartitions counts the partitions of the aggregates that a relay owns
// (no live relay runs at that moment, so the dead one's).
func heldPartitions(t *testing.T, c *chain) int {
	t.Helper()
	var n int
	require.NoError(t, c.odb.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM outbox_relay_partition WHERE owner IS NOT NULL").Scan(&n))
	return n
}

// requireCopies checks each event is on the topic once, or twice for those
// the dead relay had in flight when twice is the window's outcome.
func requireCopies(t *testing.T, copies map[uuid.UUID]int, leased map[uuid.UUID]bool, leasedCopies int) {
	t.Helper()
	for id, n := range copies {
		want := 1
		if leased[id] {
			want = leasedCopies
		}
		require.Equal(t, want, n, "copies of event %s on the topic (leased by the dead relay: %v)", id, leased[id])
	}
}

// TestRelayKilledBeforeClaimCommit (window 1): the transaction that takes
// partitions for the relay never commits; the partitions stay free, the
// rows untouched, and the successor takes them and sends each row once.
func TestRelayKilledBeforeClaimCommit(t *testing.T) {
	t.Parallel()
	copies, leased, held := relayWindow(t, "relay/before-claim-commit=kill", nil)
	require.Zero(t, held, "the taking of partitions rolled back")
	require.Empty(t, leased)
	requireCopies(t, copies, leased, 1)
}

// TestRelayKilledAfterClaim (window 2): the dead relay read a batch of its
// partitions and sent nothing; once its partition leases expire the
// successor takes them and sends each row once.
func TestRelayKilledAfterClaim(t *testing.T) {
	t.Parallel()
	copies, leased, held := relayWindow(t, "relay/after-claim=kill", nil)
	require.NotZero(t, held, "the dead relay's partition leases outlive it")
	require.Empty(t, leased, "nothing was sent")
	requireCopies(t, copies, leased, 1)
}

// TestRelayKilledWhenStoredButAnswerLost (window 3): the broker stores each
// record and answers REQUEST_TIMED_OUT, so the relay cannot know; it dies
// then. The successor sends those events again with the same event_id, and
// the notifier absorbs the copies.
func TestRelayKilledWhenStoredButAnswerLost(t *testing.T) {
	t.Parallel()
	copies, leased, _ := relayWindow(t, "relay/after-produce=kill", func(c *chain) func() {
		return c.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.RequestTimedOut, Count: -1}).Remove
	})
	require.NotEmpty(t, leased)
	requireCopies(t, copies, leased, 2)
}

// TestRelayKilledAfterAckBeforeConfirm (window 4): the broker acknowledged
// the records and the relay dies before its confirm; the successor sends
// them again after the lease expires, with the same event_id.
func TestRelayKilledAfterAckBeforeConfirm(t *testing.T) {
	t.Parallel()
	copies, leased, _ := relayWindow(t, "relay/after-produce=kill", nil)
	require.NotEmpty(t, leased)
	requireCopies(t, copies, leased, 2)
}

// TestRelayKilledAfterConfirm (window 5): the rows are delivered; nothing
// is in flight and the successor sends nothing of them again.
func TestRelayKilledAfterConfirm(t *testing.T) {
	t.Parallel()
	copies, leased, _ := relayWindow(t, "relay/after-confirm=kill", nil)
	require.Empty(t, leased)
	requireCopies(t, copies, leased, 1)
}

// TestStalledRelayIsFenced: a relay that stalls past its lease cannot
// confirm rows of partitions another relay has taken since (R2). Relay A
// sends the first batch and freezes (SIGSTOP) before its confirm; its
// partition leases expire; relay B takes the partitions under new epochs,
// reads the same rows, sends them again and freezes at the same point. A
// resumes first: its confirm carries the old epochs and matches nothing.
// B resumes: its confirm matches, so each row records where B's copy went,
// the later one on the topic. Without the epoch in the confirm's fence, A
// would mark B's rows delivered with its own, older, position.
func TestStalledRelayIsFenced(t *testing.T) {
	t.Parallel()
	c := newChain(t, map[string]string{"RELAY_ENABLED": "false"})
	c.commands(t)
	env := ordersEnv(c.odb, c.ordersAddr, c.broker)
	stalling := func() map[string]string {
		e := map[string]string{"RELAY_METRICS_ADDR": freeAddr(t), "FAILPOINTS": "relay/after-produce=stop"}
		for k, v := range env {
			e[k] = v
		}
		// Twice the other tests' lease: each send has half of it, and A's
		// first batch must reach the broker even on a loaded machine under
		// the race detector, or there is nothing for the fence to refuse.
		e["RELAY_LEASE"] = "6s"
		return e
	}
	// A freezes after its first batch's sends. On a machine loaded by the
	// rest of the suite, its read can outlast the batch's produce deadline
	// (which counts from the read), and then nothing was sent: there is
	// nothing for the fence to refuse. Such an A is killed, and another one,
	// which takes the partitions once the dead one's leases have expired,
	// tries again.
	var a *proc
	var first map[uuid.UUID]bool
	for attempt := 1; ; attempt++ {
		a = start(t, "orders", stalling(), "relay")
		require.Eventually(t, func() bool { return strings.Contains(a.out.String(), "relay/after-produce reached: SIGSTOP") },
			30*time.Second, 20*time.Millisecond, "A sent its batch and froze")
		if first = leasedRows(t, c); len(first) > 0 {
			break
		}
		require.Less(t, attempt, 3, "A's batch is on the topic, unconfirmed: none of it was, in three attempts")
		t.Logf("attempt %d: A froze with none of its batch on the topic; killing it and starting another", attempt)
		a.kill(t)
	}

	b := start(t, "orders", stalling(), "relay") // takes the partitions once A's leases have expired
	require.Eventually(t, func() bool { return strings.Contains(b.out.String(), "relay/after-produce reached: SIGSTOP") },
		30*time.Second, 20*time.Millisecond, "B took the expired partitions, sent again and froze")

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	require.Eventually(t, func() bool { return strings.Contains(a.out.String(), "lease was lost") },
		30*time.Second, 20*time.Millisecond, "A's confirm matched nothing")
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGCONT))
	require.Eventually(t, func() bool { return c.undelivered(t) == 0 }, 30*time.Second, 50*time.Millisecond)

	want := map[uuid.UUID]bool{}
	for _, r := range outboxRows(t, c.odb.Pool) {
		want[r.eventID] = true
	}
	latest := map[uuid.UUID]int64{}
	for _, rec := range readTopic(t, c.broker, want) {
		id := uuid.MustParse(rec.headers["ce_id"])
		latest[id] = max(latest[id], rec.raw.Offset)
	}
	for id := range first {
		var offset int64
		require.NoError(t, c.odb.Pool.QueryRow(context.Background(), "SELECT broker_offset FROM outbox WHERE event_id = $1", id).Scan(&offset))
		require.Equal(t, latest[id], offset, "event %s records B's copy, not the stalled relay's", id)
	}
}
