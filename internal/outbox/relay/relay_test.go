package relay_test

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxref/orders/internal/outbox"
)

// TestRoundTrip: a published record carries the key, the CloudEvents
// headers of R7 and the payload, and its partition and offset are written
// to the row (R2).
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	evs := e.Insert(t,
		event("order-1", 1, func(ev *outbox.Event) { ev.Traceparent = tp }),
		event("order-1", 2, loose),
	)
	start(t, e.relay(t, nil))
	e.WaitDelivered(t, 10*time.Second)

	recs := e.ReadAll(t)
	require.Len(t, recs, 2)
	rows := e.Rows(t)
	for i, ev := range evs {
		rec := recs[i]
		require.Equal(t, ev.ID, rec.EventID, "records of one aggregate arrive in version order")
		require.Equal(t, "order-1", rec.Key)
		require.JSONEq(t, string(ev.Payload), string(rec.Value))

		r := rows[ev.ID]
		require.Equal(t, "delivered", r.State)
		require.NotNil(t, r.Partition)
		require.Equal(t, rec.Partition, *r.Partition)
		require.Equal(t, rec.Offset, *r.Offset)

		var createdAt time.Time
		require.NoError(t, e.DB.Pool.QueryRow(t.Context(), "SELECT created_at FROM outbox WHERE event_id = $1", ev.ID).Scan(&createdAt))
		want := map[string]string{
			"ce_specversion":      "1.0",
			"ce_id":               ev.ID.String(),
			"ce_type":             ev.Type,
			"ce_source":           "urn:outboxref:test",
			"ce_subject":          "order-1",
			"ce_time":             createdAt.UTC().Format(time.RFC3339Nano),
			"content-type":        "application/json",
			"ce_aggregatetype":    "test",
			"ce_aggregateversion": strconv.Itoa(i + 1),
			"ce_schemaversion":    "1",
		}
		if ev.Traceparent != "" {
			want["traceparent"] = tp
		}
		require.Equal(t, want, rec.Headers)
		ceTime, err := time.Parse(time.RFC3339, rec.Headers["ce_time"])
		require.NoError(t, err, "ce_time is RFC 3339")
		require.True(t, ceTime.Equal(createdAt))
		require.True(t, json.Valid(rec.Value))
	}
}

// TestRelayOverSASL: the relay reaches a cluster that requires SCRAM with
// the connection options the caller passes in Config.Kafka; the relay's own
// producer options come after them and do not undo them.
func TestRelayOverSASL(t *testing.T) {
	t.Parallel()
	e := setup(t, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "relay", "secret"))
	e.Conn = []kgo.Opt{
		kgo.SeedBrokers(e.Addrs...),
		kgo.SASL(scram.Auth{User: "relay", Pass: "secret"}.AsSha512Mechanism()),
	}
	ev := e.Insert(t, event("sasl", 1))[0]
	start(t, e.relay(t, nil))
	e.WaitDelivered(t, 10*time.Second)
	require.Equal(t, 1, ids(e.ReadAll(t))[ev.ID])
}
