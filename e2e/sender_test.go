package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/notify/smtptest"
)

// TestNotifierKilledMidSendLeavesOneUnknown (C4): the notifier is killed
// with SIGKILL while its sender waits on an SMTP server that never sends
// its greeting, with more emails due behind that one. The sender claims a
// row only when its send begins, so exactly one row is left 'sending': the
// successor's stuck-send sweep turns that one into 'unknown' (for an
// operator, never silently resent), and sends the others once.
func TestNotifierKilledMidSendLeavesOneUnknown(t *testing.T) {
	t.Parallel()
	broker := newBroker(t)
	odb, ndb := ordersDB(t), notifierDB(t)
	smtp := smtptest.StartWith(t, smtptest.Options{StallGreeting: true})
	ordersAddr, notifierAddr := freeAddr(t), freeAddr(t)

	orders := start(t, "orders", ordersEnv(odb, ordersAddr, broker), "serve")
	waitReady(t, orders, "http://"+ordersAddr+"/readyz")
	env := map[string]string{
		"DATABASE_URL":        ndb.URL,
		"HTTP_ADDR":           notifierAddr,
		"KAFKA_BROKERS":       broker,
		"ORDERS_TOPIC":        topic,
		"KAFKA_GROUP":         "notifier-e2e",
		"SMTP_ADDR":           smtp.Addr,
		"EMAIL_POLL_INTERVAL": "100ms",
		"ORDERS_API_URL":      "http://" + ordersAddr,
		"ORDERS_API_TOKEN":    "dev-notifier",
	}
	// The events are on the topic before the notifier starts, so their
	// ledger rows are written together and all are due at the first pass.
	client := api{base: "http://" + ordersAddr, token: "dev-alice", http: &http.Client{Timeout: 5 * time.Second}}
	const emails = 5
	for range emails {
		status, _, err := client.call("POST", "/orders", "", newOrder("alice@example.com"))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status)
	}
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, odb.Pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE state = 'delivered'").Scan(&n))
		return n == emails
	}, 30*time.Second, 50*time.Millisecond)
	notifier := start(t, "notifier", env, "serve")
	waitReady(t, notifier, "http://"+notifierAddr+"/readyz")

	count := func(state string) int {
		var n int
		require.NoError(t, ndb.Pool.QueryRow(context.Background(), "SELECT count(*) FROM email_send WHERE state = $1", state).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return count("sending") == 1 && count("pending") == emails-1 }, 30*time.Second, 50*time.Millisecond,
		"one send in progress, the others due")
	notifier.kill(t)
	require.Equal(t, 1, count("sending"), "the kill left one row in sending, not a batch")

	smtp.ReleaseGreeting()
	env["SMTP_TIMEOUT"], env["EMAIL_SENDING_TIMEOUT"] = "1s", "2s" // the sweep may judge the dead send quickly
	successor := start(t, "notifier", env, "serve")
	waitReady(t, successor, "http://"+notifierAddr+"/readyz")
	require.Eventually(t, func() bool { return count("unknown") == 1 && count("sent") == emails-1 }, 30*time.Second, 100*time.Millisecond,
		"the dead send is unknown, the others are sent")
	require.Len(t, smtp.Received(), emails-1, "nothing was resent")
	var class string
	require.NoError(t, ndb.Pool.QueryRow(context.Background(), "SELECT last_error_class FROM email_send WHERE state = 'unknown'").Scan(&class))
	require.Equal(t, "sending_timeout", class)
	t.Logf("unknown after the kill: %d (the send in progress); sent: %d", count("unknown"), count("sent"))
}
