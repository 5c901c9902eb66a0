package notify

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
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

// blockingMailer holds every email to one recipient until release is
// closed, and accepts the others at once.
type blockingMailer struct {
	held    string
	holding chan struct{} // closed when the held email's send has begun
	release chan struct{}
	sent    chan string // the recipients accepted, in order
}

func (m *blockingMailer) Send(ctx context.Context, _, to string, _ []byte) (string, error) {
	if to == m.held {
		close(m.holding)
		select {
		case <-m.release:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	m.sent <- to
	return "250 ok", nil
}

// TestWorkersDoNotWaitForEachOther: a worker whose share ran dry starts
// again on the next nudge while another worker is still busy with a slow
// send. Workers that waited for each other after each drain would leave
// the new email until the slow send ends: under a steady stream, one busy
// worker then held the others idle.
func TestWorkersDoNotWaitForEachOther(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, schema.Notifier()...)
	mailer := &blockingMailer{held: "slow@example.com", holding: make(chan struct{}), release: make(chan struct{}),
		sent: make(chan string, 10)}
	write := func(lastByte byte, to string) { writeEmailInShare(t, db.Pool, lastByte, to) }
	write(0, "slow@example.com") // worker 0's share
	s := runTwoWorkers(t, db.Pool, mailer)
	var release sync.Once
	// Before the sender stops (cleanups run last first): a send does not
	// follow ctx.
	t.Cleanup(func() { release.Do(func() { close(mailer.release) }) })
	select {
	case <-mailer.holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the first email's send never began")
	}

	// Worker 1 found its share empty right at the start; give its claim
	// time to have returned, so the new row is not picked up by that drain.
	time.Sleep(300 * time.Millisecond)
	write(1, "quick@example.com") // worker 1's share
	s.Nudge()
	select {
	case to := <-mailer.sent:
		require.Equal(t, "quick@example.com", to)
	case <-time.After(10 * time.Second):
		t.Fatal("the idle worker did not send the new email while the other worker's send was slow")
	}
	release.Do(func() { close(mailer.release) })
	select {
	case to := <-mailer.sent:
		require.Equal(t, "slow@example.com", to)
	case <-time.After(10 * time.Second):
		t.Fatal("the slow email was not sent once released")
	}
}

// TestNudgeOrderWakesOnlyItsWorker: after ledger rows for an order commit,
// the worker whose share holds it starts at once and the others stay idle
// (each would spend a claim finding nothing). An email in another share
// waits for its own nudge or the poll.
func TestNudgeOrderWakesOnlyItsWorker(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, schema.Notifier()...)
	mailer := &blockingMailer{sent: make(chan string, 10)}
	s := runTwoWorkers(t, db.Pool, mailer)
	write := func(lastByte byte, to string) uuid.UUID { return writeEmailInShare(t, db.Pool, lastByte, to) }
	time.Sleep(300 * time.Millisecond) // the first drains, at start, found nothing
	write(0, "other@example.com")      // worker 0's share, not nudged
	order := write(3, "nudged@example.com")
	s.NudgeOrder(order.String()) // worker 1's share (3 % 2)
	select {
	case to := <-mailer.sent:
		require.Equal(t, "nudged@example.com", to)
	case <-time.After(10 * time.Second):
		t.Fatal("the nudged worker did not send its order's email")
	}
	select {
	case to := <-mailer.sent:
		t.Fatalf("%s sent by a worker that was not nudged", to)
	case <-time.After(500 * time.Millisecond):
	}
	s.NudgeOrder("not-a-uuid") // wakes every worker
	select {
	case to := <-mailer.sent:
		require.Equal(t, "other@example.com", to)
	case <-time.After(10 * time.Second):
		t.Fatal("a nudge for an id that is not a UUID did not wake every worker")
	}
}

// writeEmailInShare writes a pending email to to for a new order whose id
// ends in lastByte, which puts it in the share of worker lastByte % workers
// (the claim's get_byte(uuid_send(order_id), 15) % workers), and returns
// the order id.
func writeEmailInShare(t *testing.T, pool *pgxpool.Pool, lastByte byte, to string) uuid.UUID {
	t.Helper()
	orderID := uuid.New()
	orderID[15] = lastByte
	id := uuid.New()
	_, err := pool.Exec(context.Background(), `INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
			aggregate_version, event_time, recipient, subject, body)
		VALUES ($1::uuid::text, $1::uuid, '<' || $1::uuid::text || '>', $2, 'order.placed', 1, clock_timestamp(), $3, 's', 'b')`,
		id, orderID, to)
	require.NoError(t, err)
	return orderID
}

// runTwoWorkers runs a sender with two workers and an hour's poll until the
// test ends.
func runTwoWorkers(t *testing.T, pool *pgxpool.Pool, mailer Mailer) *Sender {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	s := NewSender(pool, mailer, SenderConfig{From: "orders@shop.test", PollInterval: time.Hour, SendingTimeout: time.Minute,
		Workers: 2}, m, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-stopped)
	})
	return s
}
