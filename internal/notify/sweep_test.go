package notify

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/notify/smtptest"
	"github.com/outboxref/orders/internal/pgtest"
)

// slowMailer is a relay that takes its time over each message, as one
// does under load.
type slowMailer struct {
	Mailer
	delay time.Duration
}

func (m slowMailer) Send(ctx context.Context, from, to string, msg []byte) (string, error) {
	select {
	case <-ctx.Done():
	case <-time.After(m.delay):
	}
	return m.Mailer.Send(ctx, from, to, msg)
}

// TestStuckSendSweptDuringALongPass: a row left 'sending' by an instance
// that died becomes unknown within a couple of sweep intervals, while this
// sender is busy draining a backlog through a slow relay, not when the pass
// ends. The row appears after the pass began, so only the sweep's own timer
// can find it in time.
func TestStuckSendSweptDuringALongPass(t *testing.T) {
	t.Parallel()
	const n = 100 // at 50ms each, a pass of five seconds
	db := pgtest.New(t, schema.Notifier()...)
	srv := smtptest.Start(t)
	mailer := &SMTPMailer{Addr: srv.Addr, HeloName: "notifier.test", Timeout: 5 * time.Second, TLS: TLSNone, MaxIdle: 1}
	t.Cleanup(func() { _ = mailer.Close() })
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	s := NewSender(db.Pool, slowMailer{Mailer: mailer, delay: 50 * time.Millisecond}, SenderConfig{From: "orders@shop.test",
		PollInterval: time.Hour, SendingTimeout: 2 * time.Second}, m, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	require.Equal(t, 500*time.Millisecond, s.SweepInterval(), "a quarter of the sending timeout")
	ctx := context.Background()
	_, err = db.Pool.Exec(ctx, `INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
			aggregate_version, event_time, recipient, subject, body)
		SELECT id::text, id, '<' || id::text || '>', gen_random_uuid(), 'order.placed', 1, clock_timestamp(),
			'alice@example.com', 'Order received', 'Hello'
		FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, $1)) g`, n)
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})
	require.Eventually(t, func() bool { return len(srv.Received()) >= 2 }, 10*time.Second, 10*time.Millisecond, "the pass has begun")

	// Another instance claimed this row an hour ago and died mid-send.
	_, err = db.Pool.Exec(ctx, `INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
			aggregate_version, event_time, recipient, subject, body, state, attempts, claimed_by, claim_token, sending_since)
		VALUES ('stuck', gen_random_uuid(), '<stuck>', gen_random_uuid(), 'order.placed', 1, now(),
			'bob@example.com', 's', 'b', 'sending', 1, 'dead-instance', gen_random_uuid(), now() - interval '1 hour')`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var state string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT state FROM email_send WHERE operation_key = 'stuck'`).Scan(&state))
		return state == StateUnknown
	}, 3*s.SweepInterval(), 10*time.Millisecond, "the abandoned send is unknown within a couple of sweep intervals")
	require.Less(t, len(srv.Received()), n, "while the pass is still sending the backlog")
	var class string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT last_error_class FROM email_send WHERE operation_key = 'stuck'`).Scan(&class))
	require.Equal(t, "sending_timeout", class)
}
