package notify

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/notify/notifydb"
	"github.com/outboxref/orders/internal/notify/smtptest"
	"github.com/outboxref/orders/internal/pgtest"
)

// TestClaimStartsAtItsFloor: a claim leaves its row's old entry in
// email_send_pending_due_idx until the ledger is vacuumed, and a claim
// from the start of the index steps over every one of them. The sender's
// claims start at the floor EmailSendPendingFloor finds: the first pending
// row. Here 40,000 emails were written and the first 39,000 claimed and
// sent; the claim's walk of the index from the floor touches a fraction of
// the blocks the walk from the start does (whether or not an earlier walk
// could mark the claimed rows' entries dead, which an open snapshot
// anywhere on the server prevents), and the claim takes the same row.
func TestClaimStartsAtItsFloor(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, schema.Notifier()...)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `ALTER TABLE email_send SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type, aggregate_version, event_time,
		                        recipient, subject, body, next_attempt_at)
		SELECT 'k' || g, md5('e' || g)::uuid, '<k' || g || '>', md5('o' || g)::uuid, 'order.placed', 1, now(),
		       'a@example.com', 's', 'b', now() - interval '1 hour' + g * interval '1 ms'
		FROM generate_series(1, 40000) AS g`)
	require.NoError(t, err)
	for range 39 {
		_, err := db.Pool.Exec(ctx, `
			UPDATE email_send SET state = 'sent', attempts = 1, sent_at = now()
			WHERE operation_key IN (SELECT operation_key FROM email_send WHERE state = 'pending'
			                        ORDER BY next_attempt_at, operation_key LIMIT 1000)`)
		require.NoError(t, err)
	}
	floor, err := notifydb.New(indexOrder{db: db.Pool}).EmailSendPendingFloor(ctx, 5)
	require.NoError(t, err)
	var first time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT min(next_attempt_at) FROM email_send WHERE state = 'pending'`).Scan(&first))
	require.True(t, floor.Equal(first), "the floor is the first pending row's due time: %s, want %s", floor, first)

	claim := func(floor time.Time) (pgtest.Plan, string) {
		var key string
		q := pgtest.Capture(t, db.URL, func(ctx context.Context, tx pgx.Tx) {
			row, err := notifydb.New(indexOrder{db: tx}).EmailSendClaimOne(ctx, notifydb.EmailSendClaimOneParams{
				ClaimToken: uuid.New(), ClaimedBy: "test", MaxAttempts: 10, Workers: 1, Worker: 0, PendingFloor: floor})
			require.NoError(t, err)
			key = row.OperationKey
		})
		return pgtest.Explain(t, db.Pool, q...), key
	}
	claim(time.Time{}) // a first walk past the claimed rows, as the sender's claims before this one
	fromStart, want := claim(time.Time{})
	fromFloor, got := claim(floor)
	const index = "email_send_pending_due_idx"
	t.Logf("blocks touched by the walk of %s: %d from the start, %d from the floor", index, fromStart.IndexBlocks(index), fromFloor.IndexBlocks(index))
	require.Equal(t, "k39001", want)
	require.Equal(t, want, got)
	require.Positive(t, fromFloor.IndexBlocks(index), "the claim walks %s:\n%s", index, fromFloor)
	require.Less(t, 10*fromFloor.IndexBlocks(index), fromStart.IndexBlocks(index), "the claim from the floor steps over the claimed rows:\n%s", fromFloor)
}

// TestLateCommitBelowTheClaimFloor: an email written before the sender's
// floor by a transaction that commits only after the floor passed it is
// still sent, once the next search moves the floor down to it.
func TestLateCommitBelowTheClaimFloor(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, schema.Notifier()...)
	srv := smtptest.Start(t)
	mailer := &SMTPMailer{Addr: srv.Addr, HeloName: "notifier.test", Timeout: 5 * time.Second, TLS: TLSNone}
	t.Cleanup(func() { _ = mailer.Close() })
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	s := NewSender(db.Pool, mailer, SenderConfig{From: "orders@shop.test", PollInterval: 50 * time.Millisecond, SendingTimeout: time.Minute},
		m, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	s.floorLag = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	id := uuid.New()
	var written time.Time
	require.NoError(t, tx.QueryRow(ctx, `INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
			aggregate_version, event_time, recipient, subject, body)
		VALUES ($1::uuid::text, $1::uuid, '<' || $1::uuid::text || '>', gen_random_uuid(), 'order.placed', 1, clock_timestamp(),
			'alice@example.com', 's', 'b')
		RETURNING next_attempt_at`, id).Scan(&written))
	require.Eventually(t, func() bool { return s.pendingFloor().After(written) }, 10*time.Second, 10*time.Millisecond,
		"the sender's claims start after the uncommitted email")
	require.NoError(t, tx.Commit(ctx))

	require.Eventually(t, func() bool { return len(srv.Accepted()) == 1 }, 10*time.Second, 20*time.Millisecond, "the late email is sent")
	require.Equal(t, "<"+id.String()+">", srv.Accepted()[0].MessageID)
}

// TestFloorSearchLogsAnOutageOnce: while the floor search fails (here the
// ledger is renamed away, as good as a database that refuses it), it warns
// once, not once a second, and says when it succeeds again; the next
// failure is a new outage and warns again.
func TestFloorSearchLogsAnOutageOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, schema.Notifier()...)
	ctx := context.Background()
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	var logs bytes.Buffer
	s := NewSender(db.Pool, nil, SenderConfig{From: "orders@shop.test"}, m, slog.New(slog.NewJSONHandler(&logs, nil)))
	rename := func(from, to string) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, "ALTER TABLE "+from+" RENAME TO "+to)
		require.NoError(t, err)
	}
	levels := func() []string {
		var out []string
		for _, line := range bytes.Split(bytes.TrimSpace(logs.Bytes()), []byte("\n")) {
			var rec struct{ Level, Msg string }
			require.NoError(t, json.Unmarshal(line, &rec))
			out = append(out, rec.Level)
		}
		logs.Reset()
		return out
	}

	rename("email_send", "email_send_away")
	for range 3 {
		s.findFloor(ctx)
		require.True(t, s.pendingFloor().IsZero(), "a failed search claims from the beginning")
	}
	require.Equal(t, []string{"WARN"}, levels(), "three failed searches, one warning")

	rename("email_send_away", "email_send")
	s.findFloor(ctx)
	s.findFloor(ctx)
	require.Equal(t, []string{"INFO"}, levels(), "the first success after the outage says so, once")
	require.False(t, s.pendingFloor().IsZero())

	rename("email_send", "email_send_away")
	s.findFloor(ctx)
	require.Equal(t, []string{"WARN"}, levels(), "a new outage warns again")
}
