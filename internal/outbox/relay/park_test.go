package relay_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/relay"
)

// TestPoison (V3, R5, R6): an event this relay cannot send is parked. Here
// it is one written by newer code, with a schema version this relay does
// not know, during a rolling deploy. Other aggregates keep flowing, the
// parked aggregate's later strict events wait (and the blocked gauge says
// so), and its independent event continues. Repairing and resuming the
// parked row, with the same event_id, unblocks the aggregate.
func TestPoison(t *testing.T) {
	t.Parallel()
	e := setup(t)
	poison := e.InsertRaw(t, event("poisoned", 1, func(ev *outbox.Event) { ev.SchemaVersion = 2 }))[0]
	evs := e.Insert(t,
		event("poisoned", 2),
		event("poisoned", 3, loose),
		event("poisoned", 4),
		event("healthy", 1),
		event("healthy", 2),
		event("healthy", 3),
	)
	laterStrict, independent, laterStrict2 := evs[0], evs[1], evs[2]

	reg := prometheus.NewRegistry()
	r := start(t, e.relay(t, func(c *relayConfig) { c.Registerer = reg }))
	require.Eventually(t, func() bool {
		return e.Count(t, "state = 'delivered'") == 4 && e.Count(t, "state = 'parked'") == 1
	}, 10*time.Second, 10*time.Millisecond)
	// Give the relay a few more claims: the blocked events must still wait.
	rounds := r.Relay.ClaimRounds()
	require.Eventually(t, func() bool { return r.Relay.ClaimRounds() > rounds+3 }, 5*time.Second, 10*time.Millisecond)

	rows := e.Rows(t)
	p := rows[poison.ID]
	require.Equal(t, "parked", p.State)
	require.Equal(t, "unknown_schema_version", *p.LastErrorClass)
	require.Contains(t, *p.LastError, "schema version 2")
	require.Equal(t, 1, p.Attempts)
	require.Equal(t, "delivered", rows[independent.ID].State, "an independent type continues")
	for _, ev := range []outbox.Event{laterStrict, laterStrict2} {
		r := rows[ev.ID]
		require.Equal(t, "pending", r.State, "v%d waits behind the parked head", ev.AggregateVersion)
		require.Zero(t, r.Attempts, "and was never sent")
	}
	labels := map[string]string{"event_type": strictType}
	require.Equal(t, 1.0, metricValue(t, reg, "outbox_blocked_aggregates", labels))
	require.Equal(t, 1.0, metricValue(t, reg, "outbox_parked_events", labels))
	require.Equal(t, 2.0, metricValue(t, reg, "outbox_pending_events", labels))
	require.Equal(t, 1.0, metricValue(t, reg, "outbox_publish_errors_total",
		map[string]string{"event_type": strictType, "class": "unknown_schema_version"}))

	got := ids(e.ReadAll(t))
	require.Len(t, got, 4)
	require.NotContains(t, got, poison.ID)
	require.NotContains(t, got, laterStrict.ID)

	// An operator repairs the row and resumes it (O4): the same event_id
	// is delivered, then the strict events behind it, in order. The repair
	// bypasses Insert, so it is checked with the Writer first.
	repaired := poison
	repaired.SchemaVersion = 1
	require.NoError(t, testWriter.Validate([]outbox.Event{repaired}))
	_, err := e.DB.Pool.Exec(context.Background(),
		`UPDATE outbox SET schema_version = 1, state = 'pending', next_attempt_at = now() WHERE event_id = $1`, poison.ID)
	require.NoError(t, err)
	e.WaitDelivered(t, 10*time.Second)
	var order []int64
	for _, rec := range e.ReadAll(t) {
		if rec.Key == "poisoned" {
			order = append(order, rec.Version)
		}
	}
	require.Equal(t, []int64{3, 1, 2, 4}, order)
	// The gauges read the table once per refresh interval.
	require.Eventually(t, func() bool { return metricValue(t, reg, "outbox_blocked_aggregates", labels) == 0 },
		3*relay.DefaultStatsRefresh, 50*time.Millisecond)
}

// TestParkDeterministicFailures (R5): events that can never be sent are
// parked with their reason, and events sharing their batch are delivered.
func TestParkDeterministicFailures(t *testing.T) {
	t.Parallel()
	// The broker accepts record batches up to 16 KiB, the client up to its
	// default 1 MB: the broker's MESSAGE_TOO_LARGE decides.
	e := setup(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "16384"}))
	// Random bytes, so that the producer's compression cannot shrink the
	// record under the limit.
	blob := base64.StdEncoding.EncodeToString(randomBytes(t, 30_000))
	// Rows the Writer refuses, as older or newer code may have written them.
	evs := e.InsertRaw(t,
		event("unknown-type", 1, func(ev *outbox.Event) { ev.Type = "test.unknown" }),
		event("unknown-version", 1, func(ev *outbox.Event) { ev.SchemaVersion = 2 }),
	)
	evs = append(evs, e.Insert(t,
		// One key, one partition, one claim: the big record shares its
		// record batch with two small ones.
		event("big", 1, loose, withPayload(fmt.Sprintf(`{"n": 1, "blob": %q}`, blob))),
		event("big", 2, loose),
		event("big", 3, loose),
		event("fine", 1),
	)...)
	start(t, e.relay(t, nil))
	e.WaitDelivered(t, 15*time.Second)

	rows := e.Rows(t)
	want := map[int]struct{ class, reason string }{
		0: {"unknown_event_type", `"test.unknown"`},
		1: {"unknown_schema_version", "schema version 2"},
		2: {"message_too_large", "MESSAGE_TOO_LARGE"},
	}
	for i, ev := range evs {
		r := rows[ev.ID]
		w, parked := want[i]
		if !parked {
			require.Equal(t, "delivered", r.State, "%s v%d", ev.AggregateID, ev.AggregateVersion)
			continue
		}
		require.Equal(t, "parked", r.State, "%s", ev.AggregateID)
		require.Equal(t, w.class, *r.LastErrorClass)
		require.Contains(t, *r.LastError, w.reason)
		require.LessOrEqual(t, len([]rune(*r.LastError)), 1024)
	}
	got := ids(e.ReadAll(t))
	require.Len(t, got, 3)
}

// TestRelaySendsPayloadsAsWritten pins a design decision: the relay checks
// a row's type and schema version, not its payload. A row the Writer would
// have refused for its payload alone, written around it, is sent as it is;
// validation happens once, in the business transaction (see admit).
func TestRelaySendsPayloadsAsWritten(t *testing.T) {
	t.Parallel()
	e := setup(t)
	bypassed := event("bypassed", 1, withPayload(`{"n": "not a number"}`))
	require.ErrorIs(t, testWriter.Validate([]outbox.Event{bypassed}), outbox.ErrInvalidEvent)
	ev := e.InsertRaw(t, bypassed)[0]
	start(t, e.relay(t, nil))
	e.WaitDelivered(t, 10*time.Second)
	require.Equal(t, "delivered", e.Row(t, ev.ID).State)
	recs := e.ReadAll(t)
	require.Len(t, recs, 1)
	require.JSONEq(t, `{"n": "not a number"}`, string(recs[0].Value))
}

// TestParkOverClientLimit: a record over the relay's own MaxMessageBytes is
// refused by the client before it reaches the broker, and parked.
func TestParkOverClientLimit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	big := e.Insert(t, event("big", 1, withPayload(fmt.Sprintf(`{"n": 1, "blob": %q}`, strings.Repeat("y", 8000)))))[0] // checked before compression
	small := e.Insert(t, event("small", 1))[0]
	start(t, e.relay(t, func(c *relayConfig) { c.MaxMessageBytes = 4096 }))
	e.WaitDelivered(t, 10*time.Second)
	require.Equal(t, "parked", e.Row(t, big.ID).State)
	require.Equal(t, "message_too_large", *e.Row(t, big.ID).LastErrorClass)
	require.Equal(t, "delivered", e.Row(t, small.ID).State)
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}
