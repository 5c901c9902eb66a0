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
	"github.com/outboxref/orders/internal/pgtest"
)

// funcMailer sends by calling its function with the how-manieth send it is
// (from 1).
type funcMailer struct {
	n  int
	fn func(n int) (string, error)
}

func (m *funcMailer) Send(context.Context, string, string, []byte) (string, error) {
	m.n++
	return m.fn(m.n)
}

// TestSenderResultCommitsWithNextClaim (C4): a worker writes an email's
// result in the transaction that claims its next one. While the second
// email is being sent, the first is already 'sent' and the second is the
// only row in 'sending': a crash there leaves one unknown, as with a claim
// of its own. When that shared transaction fails, the result is still
// written on its own before the pass ends, never left for the sweep to
// call unknown.
func TestSenderResultCommitsWithNextClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T, fn func(db *pgtest.DB, n int) (string, error)) (*Sender, *pgtest.DB) {
		db := pgtest.New(t, schema.Notifier()...)
		_, err := db.Pool.Exec(ctx, `INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
				aggregate_version, event_time, recipient, subject, body)
			SELECT id::text, id, '<' || id::text || '>', gen_random_uuid(), 'order.placed', 1, clock_timestamp(),
				'alice@example.com', 'Order received', 'Hello'
			FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, 3)) g`)
		require.NoError(t, err)
		m, err := NewMetrics(prometheus.NewRegistry())
		require.NoError(t, err)
		mailer := &funcMailer{fn: func(n int) (string, error) { return fn(db, n) }}
		return NewSender(db.Pool, mailer, SenderConfig{From: "orders@shop.test", PollInterval: time.Hour, SendingTimeout: time.Minute},
			m, slog.New(slog.NewJSONHandler(io.Discard, nil))), db
	}
	states := func(t *testing.T, db *pgtest.DB) map[string]int {
		rows, err := db.Pool.Query(ctx, `SELECT state, count(*) FROM email_send GROUP BY state`)
		require.NoError(t, err)
		got := map[string]int{}
		for rows.Next() {
			var state string
			var n int
			require.NoError(t, rows.Scan(&state, &n))
			got[state] = n
		}
		require.NoError(t, rows.Err())
		return got
	}

	t.Run("OneSendingAtATime", func(t *testing.T) {
		t.Parallel()
		var during []map[string]int
		s, db := setup(t, func(db *pgtest.DB, n int) (string, error) {
			during = append(during, states(t, db))
			return "250 OK", nil
		})
		sent, err := s.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 3, sent)
		require.Equal(t, []map[string]int{
			{"sending": 1, "pending": 2},
			{"sent": 1, "sending": 1, "pending": 1},
			{"sent": 2, "sending": 1},
		}, during, "each send sees the earlier ones recorded and itself the only one in sending")
		require.Equal(t, map[string]int{"sent": 3}, states(t, db))
	})

	t.Run("ResultWrittenAloneWhenTheClaimFails", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t, func(db *pgtest.DB, n int) (string, error) {
			if n == 1 {
				// From now on every claim fails; a result's update does not.
				_, err := db.Pool.Exec(ctx, `
					CREATE FUNCTION refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
					BEGIN RAISE EXCEPTION 'claims refused by the test'; END $$;
					CREATE TRIGGER refuse_claim BEFORE UPDATE ON email_send
					FOR EACH ROW WHEN (NEW.state = 'sending') EXECUTE FUNCTION refuse_claim();`)
				require.NoError(t, err)
			}
			return "250 OK", nil
		})
		sent, err := s.RunOnce(ctx)
		require.ErrorContains(t, err, "claims refused by the test")
		require.Equal(t, 1, sent)
		require.Equal(t, map[string]int{"sent": 1, "pending": 2}, states(t, db),
			"the claim that was to carry the result failed; the result was written on its own")
	})
}
