package notify

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/pgtest"
)

// TestLedgerMaintenanceReadsLittle: the ledger gauges (refreshed every few
// seconds) and the ledger cleanup (every hour) read the rows they are about,
// never the whole ledger. With 100,000 rows, nearly all sent, every
// statement they run is re-run under EXPLAIN ANALYZE and the rows its scans
// of email_send touch must stay within the rows counted; the open states and
// skipped are exact, sent a close estimate.
func TestLedgerMaintenanceReadsLittle(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, schema.Notifier()...)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type, recipient, subject, body,
		                        state, skip_reason, attempts, created_at)
		SELECT g || '@test', gen_random_uuid(), '<' || g || '@test>', gen_random_uuid(), 'order.placed', 'a@example.com', 's', 'b',
		       CASE WHEN g % 1000 = 0 THEN 'unknown' WHEN g % 1000 = 1 THEN 'failed' WHEN g % 1000 = 2 THEN 'pending'
		            WHEN g % 50 = 3 THEN 'skipped' ELSE 'sent' END,
		       CASE WHEN g % 50 = 3 AND g % 1000 > 2 THEN 'stale' END,
		       1, now() - (g || ' seconds')::interval
		FROM generate_series(1, 100000) g;
		ANALYZE email_send;`)
	require.NoError(t, err)

	rec := &pgtest.Recorder{}
	traced := pgtest.TracedPool(t, db.URL, rec)
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	require.NoError(t, RefreshLedgerStats(ctx, traced, m))
	for state, want := range map[string]float64{StateUnknown: 100, StateFailed: 100, StatePending: 100, StateSending: 0, StateSkipped: 2_000} {
		require.Equal(t, want, testutil.ToFloat64(m.Ledger.WithLabelValues(state)), "state %s is exact", state)
	}
	require.InEpsilon(t, 97_700, testutil.ToFloat64(m.Ledger.WithLabelValues(StateSent)), 0.05, "sent is an estimate")
	n, err := CleanupLedger(ctx, traced, 30*24*time.Hour, 1000, 0)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is older than the TTL")

	queries := rec.Take()
	require.GreaterOrEqual(t, len(queries), 3, "two for the gauges, one cleanup batch")
	for _, q := range queries {
		if strings.Contains(q.SQL, "advisory") {
			continue // the cleanup's lock: no table, and not to be taken twice
		}
		read, plan := pgtest.RowsRead(t, db.Pool, q, "email_send")
		t.Log(plan)
		// The 2,300 rows counted exactly, and not the 97,700 sent ones.
		require.LessOrEqual(t, read, int64(2_500), "reads %d ledger rows:\n%s", read, plan)
	}
}
