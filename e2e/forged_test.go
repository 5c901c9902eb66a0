package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/notify"
	"github.com/outboxref/orders/internal/notify/smtptest"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

// TestForgedRecordsNeverTakeAnOrdersPlace runs the whole chain as real
// processes and writes records to the topic that the orders service never
// wrote (C7): whatever their headers claim, none takes an order's version,
// changes the projection or sends an email, and the real events that
// follow still reach the customer.
func TestForgedRecordsNeverTakeAnOrdersPlace(t *testing.T) {
	t.Parallel()
	broker := newBroker(t)
	odb, ndb := ordersDB(t), notifierDB(t)
	smtp := smtptest.Start(t)
	ordersAddr, notifierAddr := freeAddr(t), freeAddr(t)
	orders := start(t, "orders", ordersEnv(odb, ordersAddr, broker), "serve")
	waitReady(t, orders, "http://"+ordersAddr+"/readyz")
	notifier := start(t, "notifier", map[string]string{
		"DATABASE_URL":          ndb.URL,
		"HTTP_ADDR":             notifierAddr,
		"KAFKA_BROKERS":         broker,
		"ORDERS_TOPIC":          topic,
		"KAFKA_GROUP":           "notifier-forged",
		"KAFKA_SESSION_TIMEOUT": "6s",
		"SMTP_ADDR":             smtp.Addr,
		"EMAIL_POLL_INTERVAL":   "100ms",
		"GAP_WINDOW":            "1s",
		"ORDERS_API_URL":        "http://" + ordersAddr,
		"ORDERS_API_TOKEN":      "dev-notifier",
	}, "serve")
	waitReady(t, notifier, "http://"+notifierAddr+"/readyz")
	metrics := "http://" + notifierAddr + "/metrics"

	producer, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.DefaultProduceTopic(topic))
	require.NoError(t, err)
	defer producer.Close()
	forge := func(orderID string, version int64, typ, source string, payload []byte) uuid.UUID {
		t.Helper()
		id := uuid.New()
		r := cloudevents.Record(topic, cloudevents.Event{
			ID: id, Type: typ, Source: source, Time: time.Now(), AggregateType: "order", AggregateID: orderID,
			AggregateVersion: version, SchemaVersion: 1, Data: payload,
		})
		require.NoError(t, producer.ProduceSync(context.Background(), r).FirstErr())
		return id
	}
	paidPayload := func(orderID, email, currency string) []byte {
		return fmt.Appendf(nil, `{"order_id":%q,"email":%q,"currency":"%s","total_cents":1,"paid_at":"2026-12-01T10:00:00Z"}`, orderID, email, currency)
	}
	client := api{base: "http://" + ordersAddr, token: "dev-alice", http: &http.Client{Timeout: 5 * time.Second}}
	create := func() string {
		t.Helper()
		status, body, err := client.call("POST", "/orders", "", newOrder("alice@example.com"))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status)
		id := body["id"].(string)
		require.Eventually(t, func() bool { return projectionVersion(t, ndb.Pool, id) == 1 }, 30*time.Second, 50*time.Millisecond)
		return id
	}
	pay := func(id string) uuid.UUID {
		t.Helper()
		status, _, err := client.call("POST", "/orders/"+id+"/pay", `"1"`, nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)
		var eventID uuid.UUID
		require.NoError(t, odb.Pool.QueryRow(context.Background(),
			"SELECT event_id FROM outbox WHERE aggregate_id = $1 AND event_type = 'order.paid'", id).Scan(&eventID))
		return eventID
	}
	emailed := func(eventID uuid.UUID) func() bool {
		return func() bool { return smtp.Count(notify.MessageID(eventID)) == 1 }
	}

	// An unknown type from another source claims version 2 of a placed
	// order; the real payment follows, and its email arrives.
	a := create()
	forge(a, 2, "order.refunded_v9", "urn:evil", []byte(`{}`))
	paidA := pay(a)
	require.Eventually(t, emailed(paidA), 30*time.Second, 50*time.Millisecond, "the real payment's email")
	require.Eventually(t, func() bool { return projectionVersion(t, ndb.Pool, a) == 2 }, 30*time.Second, 50*time.Millisecond)

	// A well-formed order.paid from another source, to the attacker's
	// address, and one from the right source with invalid UTF-8: parked.
	b := create()
	forge(b, 2, "order.paid", "urn:evil", paidPayload(b, "evil@evil.example", "EUR"))
	forge(b, 2, "order.paid", notify.DefaultSource, paidPayload(b, "alice@example.com", "E\xffR"))
	// An impostor from the right source with a valid payload at a version
	// the real order owns: the orders API says it never wrote it.
	impostor := forge(a, 2, "order.paid", notify.DefaultSource, paidPayload(a, "evil@evil.example", "EUR"))
	// A held event far beyond anything the order will reach.
	beyond := forge(a, 6, "order.shipped", notify.DefaultSource,
		fmt.Appendf(nil, `{"order_id":%q,"email":"evil@evil.example","shipped_at":"2026-12-01T10:00:00Z"}`, a))

	require.Eventually(t, func() bool {
		var parked int
		_ = ndb.Pool.QueryRow(context.Background(), `SELECT count(*) FROM inbox_parked_record
			WHERE reason LIKE '%ce_source "urn:evil"%' OR reason LIKE '%not valid UTF-8%'`).Scan(&parked)
		return parked == 3
	}, 30*time.Second, 100*time.Millisecond, "the two records from another source and the one with invalid UTF-8 are parked")
	waitLedgerState := func(eventID uuid.UUID, want string) {
		t.Helper()
		require.Eventually(t, func() bool {
			var state, reason string
			err := ndb.Pool.QueryRow(context.Background(), "SELECT state, coalesce(skip_reason, '') FROM email_send WHERE event_id = $1", eventID).Scan(&state, &reason)
			return err == nil && state+"/"+reason == want
		}, 30*time.Second, 100*time.Millisecond, "ledger row of %s: want %s", eventID, want)
	}
	waitLedgerState(impostor, "skipped/impostor")
	waitLedgerState(beyond, "skipped/impostor")
	require.Eventually(t, func() bool {
		return scrapeGauge(t, metrics, "inbox_gaps_overdue") == 0 && scrapeGauge(t, metrics, "inbox_held_events") == 0
	},
		30*time.Second, 100*time.Millisecond, "nothing left waiting for ever")

	// The real order b still pays and emails; no one else ever got mail.
	paidB := pay(b)
	require.Eventually(t, emailed(paidB), 30*time.Second, 50*time.Millisecond)
	require.Equal(t, int64(2), projectionVersion(t, ndb.Pool, a))
	require.Equal(t, int64(2), projectionVersion(t, ndb.Pool, b))
	for _, m := range smtp.Accepted() {
		require.Equal(t, []string{"alice@example.com"}, m.To, "an email went to %v", m.To)
	}
	require.Len(t, smtp.Accepted(), 4, "placed and paid, for each order")
}

func scrapeGauge(t *testing.T, url, name string) float64 {
	t.Helper()
	v, err := scrapeMetric(url, name)
	require.NoError(t, err)
	return v
}
