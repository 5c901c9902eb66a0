package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/relay"
)

// TestNudge (R8): with a 10 s poll interval, an event reaches the broker
// soon after Nudge (a fraction of a second; up to 5 s are allowed for a
// machine busy with other tests, still well before the next poll), and not
// before it.
func TestNudge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := start(t, e.relay(t, func(c *relayConfig) { c.PollInterval = 10 * time.Second }))
	require.Eventually(t, func() bool { return r.Relay.ClaimRounds() >= 1 }, 5*time.Second, 5*time.Millisecond,
		"the relay made its start-up claim and now sleeps for the poll interval")

	ev := e.Insert(t, event("nudged", 1))[0]
	require.Never(t, func() bool { return e.Row(t, ev.ID).State == "delivered" }, 300*time.Millisecond, 20*time.Millisecond,
		"without a nudge the event waits for the next poll")

	nudged := time.Now()
	r.Relay.Nudge()
	r.Relay.Nudge() // coalesces, never blocks
	require.Eventually(t, func() bool { return e.Row(t, ev.ID).State == "delivered" }, 5*time.Second, 5*time.Millisecond)
	t.Logf("delivered %s after the nudge", time.Since(nudged))
	require.Len(t, e.ReadAll(t), 1)

	var disabled *relay.Relay
	disabled.Nudge() // a service with its relay disabled may nudge a nil relay
}

// TestGracefulShutdown (R9): a relay stopped while the broker does not
// answer gives up after DrainTimeout, records the stop on the rows it was
// sending and gives its partitions back, so a successor takes them and
// sends the rows at once instead of waiting out the lease.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	const lease = time.Minute
	e := setup(t)
	outage := e.Kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotEnoughReplicas, Count: -1})
	var evs []outbox.Event
	for i := range 5 {
		evs = append(evs, event(fmt.Sprintf("agg-%d", i), 1))
	}
	e.Insert(t, evs...)

	claimed := make(chan struct{}, 1)
	first := start(t, e.relay(t, func(c *relayConfig) {
		c.Owner = "first"
		c.Lease = lease
		c.DrainTimeout = 200 * time.Millisecond
		c.Hooks = relay.Hooks{AfterClaim: func(context.Context, []relay.Claim) error {
			select {
			case claimed <- struct{}{}:
			default:
			}
			return nil
		}}
	}))
	recv(t, claimed, "the first claim")
	stopping := time.Now()
	require.NoError(t, first.Stop(t))
	require.Less(t, time.Since(stopping), 5*time.Second, "stopping waits for DrainTimeout, not for the 30s produce deadline")

	require.Zero(t, e.owned(t, "first"), "the partitions were given back")
	for _, r := range e.Rows(t) {
		require.Equal(t, "pending", r.State)
		require.Equal(t, "shutdown", *r.LastErrorClass)
		require.False(t, r.NextAttemptAt.After(time.Now().Add(50*time.Millisecond)), "and due at once")
	}

	outage.Remove()
	began := time.Now()
	start(t, e.relay(t, func(c *relayConfig) { c.Owner = "successor" }))
	e.WaitDelivered(t, 10*time.Second)
	require.Less(t, time.Since(began), lease/2, "the successor did not wait for the lease")
	require.Len(t, ids(e.ReadAll(t)), len(evs))
}

// TestGracefulShutdownFinishes (R9): records the broker acknowledges while
// the relay is stopping are confirmed, not abandoned.
func TestGracefulShutdownFinishes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ev := e.Insert(t, event("finish", 1))[0]
	ctx, cancel := context.WithCancel(context.Background())
	r := e.relay(t, func(c *relayConfig) {
		c.Hooks = relay.Hooks{AfterClaim: func(context.Context, []relay.Claim) error {
			cancel() // the stop arrives after the claim, before the send
			return nil
		}}
	})
	require.NoError(t, r.Run(ctx))
	require.Equal(t, "delivered", e.Row(t, ev.ID).State)
	require.Len(t, e.ReadAll(t), 1)
}

// TestMetrics (O1): the backlog gauges come from the table, so with no
// relay running the age of the oldest pending event keeps growing; the
// relay's counters track attempts, acknowledgements and latency.
func TestMetrics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.Insert(t, event("waiting", 1), event("waiting", 2), event("other", 1, loose))

	stats := prometheus.NewRegistry()
	stats.MustRegister(relay.NewStatsCollector(e.DB.Pool, testTypes(), testLogger()))
	strict := map[string]string{"event_type": strictType}
	require.Equal(t, 1.0, metricValue(t, stats, "outbox_stats_up", nil))
	require.Equal(t, 2.0, metricValue(t, stats, "outbox_pending_events", strict))
	require.Equal(t, 1.0, metricValue(t, stats, "outbox_pending_events", map[string]string{"event_type": looseType}))
	age := metricValue(t, stats, "outbox_oldest_pending_age_seconds", strict)
	require.Eventually(t, func() bool {
		return metricValue(t, stats, "outbox_oldest_pending_age_seconds", strict) > age+0.2
	}, 5*time.Second, 20*time.Millisecond, "no relay: the age grows")

	reg := prometheus.NewRegistry()
	start(t, e.relay(t, func(c *relayConfig) { c.Registerer = reg }))
	e.WaitDelivered(t, 10*time.Second)
	require.Equal(t, 2.0, metricValue(t, reg, "outbox_publish_attempts_total", strict))
	require.Equal(t, 2.0, metricValue(t, reg, "outbox_published_total", strict))
	require.Equal(t, 2.0, metricValue(t, reg, "outbox_commit_to_publish_seconds", strict), "one latency sample per event")
	require.Equal(t, 0.0, metricValue(t, reg, "outbox_pending_events", strict))
	require.Equal(t, 0.0, metricValue(t, reg, "outbox_oldest_pending_age_seconds", strict))
	require.Equal(t, 0.0, metricValue(t, reg, "outbox_parked_events", strict))
	require.Equal(t, 0.0, metricValue(t, reg, "outbox_blocked_aggregates", strict))

	// A second relay on the same registry is a wiring mistake.
	_, err := relay.NewRelay(relay.Config{Pool: e.DB.Pool, Topic: topic, Source: "s", Types: testTypes(), Registerer: reg})
	require.Error(t, err)
}

// TestNewRelayRefusesBadConfig: problems surface at start-up, not as
// parked events later.
func TestNewRelayRefusesBadConfig(t *testing.T) {
	t.Parallel()
	e := setup(t)
	bad := func(t *testing.T, want string, mod func(*relay.Config)) {
		t.Helper()
		cfg := relay.Config{Pool: e.DB.Pool, Topic: topic, Source: "urn:test", Types: testTypes()}
		mod(&cfg)
		_, err := relay.NewRelay(cfg)
		require.ErrorContains(t, err, want)
	}
	bad(t, "half the lease", func(c *relay.Config) { c.Lease = 10 * time.Second; c.ProduceTimeout = 6 * time.Second })
	bad(t, "Source", func(c *relay.Config) { c.Source = "" })
	bad(t, "Topic", func(c *relay.Config) { c.Topic = "" })
	bad(t, "no event types", func(c *relay.Config) { c.Types = nil })
	bad(t, "listed twice", func(c *relay.Config) { c.Types = append(c.Types, c.Types[0]) })
	bad(t, "compile JSON Schema", func(c *relay.Config) {
		c.Types = []outbox.EventType{{Name: "x", Schemas: map[int][]byte{1: []byte(`{"type": 12}`)}}}
	})
	bad(t, "BackoffCap", func(c *relay.Config) { c.BackoffBase = time.Minute; c.BackoffCap = time.Second })

	cfg := relay.Config{Pool: e.DB.Pool, Topic: topic, Source: "urn:test", Types: testTypes()}
	r, err := relay.NewRelay(cfg)
	require.NoError(t, err)
	require.True(t, strings.Contains(r.Owner(), "-"), "a default owner is generated")
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	base, capDelay := 100*time.Millisecond, 3*time.Second
	for attempts := 1; attempts <= 70; attempts++ {
		want := capDelay
		if attempts < 6 {
			want = base << (attempts - 1)
		}
		for range 20 {
			d := relay.Backoff(attempts, base, capDelay)
			require.GreaterOrEqual(t, d, want/2, "attempts %d", attempts)
			require.LessOrEqual(t, d, want, "attempts %d", attempts)
		}
	}
}

func TestBoundText(t *testing.T) {
	t.Parallel()
	require.Equal(t, "short", relay.BoundText("short"))
	long := strings.Repeat("é", 2000)
	got := relay.BoundText(long)
	require.Len(t, []rune(got), 1024, "the CHECK counts characters")
	require.True(t, strings.HasSuffix(got, "…"))
}

// TestBrokerState (O3): the relay reports how the broker answered its
// latest sends, for /readyz to show as information.
func TestBrokerState(t *testing.T) {
	t.Parallel()
	e := setup(t)
	outage := e.Kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotEnoughReplicas, Count: -1})
	r := start(t, e.relay(t, func(c *relayConfig) { c.PollInterval = 50 * time.Millisecond }))
	require.Equal(t, "unknown", r.Relay.BrokerState(), "nothing sent yet")

	e.Insert(t, event("state", 1))
	require.Eventually(t, func() bool { return strings.HasPrefix(r.Relay.BrokerState(), "failing: ") }, 10*time.Second, 10*time.Millisecond)
	outage.Remove()
	require.Eventually(t, func() bool { return r.Relay.BrokerState() == relay.BrokerOK }, 30*time.Second, 10*time.Millisecond)

	var disabled *relay.Relay
	require.Equal(t, "relay disabled", disabled.BrokerState())
}

// TestStatsCollectorRefreshesOnAnInterval: the backlog gauges read the
// table once per refresh interval, whatever the number of scrapes, and the
// age keeps growing between two reads (it is now minus the oldest pending
// commit time read last).
func TestStatsCollectorRefreshesOnAnInterval(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.Insert(t, event("a", 1))
	c := relay.NewStatsCollector(e.DB.Pool, testTypes(), testLogger())
	c.SetRefresh(time.Hour)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	strict := map[string]string{"event_type": strictType}
	require.Equal(t, 1.0, metricValue(t, reg, "outbox_pending_events", strict))
	age := metricValue(t, reg, "outbox_oldest_pending_age_seconds", strict)

	e.Insert(t, event("b", 1))
	require.Eventually(t, func() bool {
		return metricValue(t, reg, "outbox_oldest_pending_age_seconds", strict) > age+0.1
	}, 5*time.Second, 20*time.Millisecond, "the age grows between reads")
	require.Equal(t, 1.0, metricValue(t, reg, "outbox_pending_events", strict), "scrapes within the interval share one read")

	c.SetRefresh(time.Millisecond)
	require.Eventually(t, func() bool { return metricValue(t, reg, "outbox_pending_events", strict) == 2 },
		5*time.Second, 20*time.Millisecond, "the next read sees the new row")
}

// TestGracefulShutdownWithBatchClaimedAhead (R9): under a backlog the relay
// reads the next batch while the broker holds the current one. Stopping
// during an outage waits one DrainTimeout for both batches' sends, not one
// per batch, records the stop on both, and gives the partitions back at
// once for a successor.
func TestGracefulShutdownWithBatchClaimedAhead(t *testing.T) {
	t.Parallel()
	const (
		batch = 5
		drain = 3 * time.Second
	)
	e := setup(t)
	outage := e.Kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotEnoughReplicas, Count: -1})
	var evs []outbox.Event
	for i := range 3 * batch {
		evs = append(evs, event(fmt.Sprintf("agg-%d", i), 1))
	}
	e.Insert(t, evs...)

	var reads claimLog
	first := start(t, e.relay(t, func(c *relayConfig) {
		c.Owner = "first"
		c.BatchSize = batch
		c.Lease = time.Minute
		c.DrainTimeout = drain
		c.Hooks.AfterClaim = reads.hook("first")
	}))
	require.Eventually(t, func() bool { return len(reads.all()) == 2*batch }, 5*time.Second, 5*time.Millisecond,
		"one batch with the broker and the next one read ahead")
	stopping := time.Now()
	require.NoError(t, first.Stop(t))
	t.Logf("stopped in %s", time.Since(stopping))
	// One DrainTimeout for the sends of both batches, and one for the
	// client's final flush.
	require.Less(t, time.Since(stopping), 2*drain+drain/4, "one DrainTimeout for both batches")

	require.Zero(t, e.owned(t, "first"), "no partition lease is left behind")
	for _, r := range e.Rows(t) {
		require.Equal(t, "pending", r.State)
	}
	require.Equal(t, 2*batch, e.Count(t, "last_error_class = 'shutdown'"))

	outage.Remove()
	start(t, e.relay(t, func(c *relayConfig) { c.Owner = "successor" }))
	e.WaitDelivered(t, 10*time.Second)
	require.Len(t, ids(e.ReadAll(t)), len(evs))
}
