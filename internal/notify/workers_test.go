package notify

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/notify/smtptest"
	"github.com/outboxref/orders/internal/pgtest"
)

// TestSenderWorkers: several workers share the ledger without sharing a
// row. Every pending email is sent exactly once and ends 'sent' after one
// attempt, one order's emails leave in the order they were written, and
// the mailer keeps one connection per worker rather than dialling per
// email.
func TestSenderWorkers(t *testing.T) {
	t.Parallel()
	const n, workers = 200, 4
	db := pgtest.New(t, schema.Notifier()...)
	srv := smtptest.Start(t)
	mailer := &SMTPMailer{Addr: srv.Addr, HeloName: "notifier.test", Timeout: 5 * time.Second, TLS: TLSNone, MaxIdle: workers}
	t.Cleanup(func() { _ = mailer.Close() })
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	s := NewSender(db.Pool, mailer, SenderConfig{From: "orders@shop.test", PollInterval: time.Hour, SendingTimeout: time.Minute,
		Workers: workers}, m, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	ctx := context.Background()
	_, err = db.Pool.Exec(ctx, `INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
			aggregate_version, event_time, recipient, subject, body)
		SELECT id::text, id, '<' || id::text || '>', gen_random_uuid(), 'order.placed', 1, clock_timestamp(),
			'alice@example.com', 'Order received', 'Hello'
		FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, $1)) g`, n)
	require.NoError(t, err)
	// And one order with five emails, written one after the other.
	orderID := uuid.New()
	var want []string
	for v := range 5 {
		id := uuid.New()
		want = append(want, "<"+id.String()+">")
		_, err = db.Pool.Exec(ctx, `INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
				aggregate_version, event_time, recipient, subject, body)
			VALUES ($1::uuid::text, $1::uuid, '<' || $1::uuid::text || '>', $2, 'order.paid', $3, clock_timestamp(), 'bob@example.com', 's', 'b')`,
			id, orderID, v+1)
		require.NoError(t, err)
	}
	require.NoError(t, err)

	sent, err := s.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, n+5, sent)
	var rows, once int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'sent' AND attempts = 1) FROM email_send`).Scan(&rows, &once))
	require.Equal(t, n+5, once, "every row sent, after a single attempt")
	accepted := srv.Accepted()
	require.Len(t, accepted, n+5, "no email sent twice")
	var order []string
	for _, msg := range accepted {
		if msg.To[0] == "bob@example.com" {
			order = append(order, msg.MessageID)
		}
	}
	require.Equal(t, want, order, "one order's emails in the order they were written")
	seen := map[string]bool{}
	for _, msg := range accepted {
		id := msg.MessageID
		require.False(t, seen[id], "%s sent twice", id)
		seen[id] = true
	}
	require.LessOrEqual(t, srv.Connections(), workers, "connections are kept and reused, one per worker at most")
}
