package operate_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox/operate"
)

// TestRunCleanup: the retention loop runs the cleanup on its interval, not
// once: a row delivered long ago is archived, and so is one that becomes
// old after the first runs. Each run is counted; the loop returns when its
// context ends, and at once when its settings could never make progress.
func TestRunCleanup(t *testing.T) {
	t.Parallel()
	e := setup(t)
	admin := e.admin()
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(admin.Collector()))
	deliveredLongAgo := func(agg string) {
		t.Helper()
		e.Insert(t, event(agg, 1))
		_, err := e.DB.Pool.Exec(context.Background(),
			"UPDATE outbox SET state = 'delivered', delivered_at = now() - interval '2 days' WHERE aggregate_id = $1", agg)
		require.NoError(t, err)
	}
	runs := func() float64 {
		return metricValue(t, reg, "outbox_cleanup_runs_total", map[string]string{"result": "ok"})
	}

	deliveredLongAgo("first")
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		admin.RunCleanup(ctx, operate.Cleanup{Retention: 24 * time.Hour, BatchSize: 10}, 20*time.Millisecond, testLogger())
	}()
	require.Eventually(t, func() bool { return e.Count(t, "true") == 0 }, 10*time.Second, 10*time.Millisecond,
		"the first run archives the old row")

	// A later run, on the interval, finds the row that aged since.
	after := runs()
	deliveredLongAgo("second")
	require.Eventually(t, func() bool { return e.Count(t, "true") == 0 && runs() >= after+1 }, 10*time.Second, 10*time.Millisecond,
		"a later run archives the row that aged after the first")
	require.Zero(t, metricValue(t, reg, "outbox_cleanup_runs_total", map[string]string{"result": "failed"}))

	stop()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("RunCleanup did not return after its context ended")
	}

	// Between two runs it waits on the interval, and stops there too: here
	// its first run would be a minute away.
	waiting, stopWaiting := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		admin.RunCleanup(waiting, operate.Cleanup{Retention: 24 * time.Hour, BatchSize: 10}, time.Hour, testLogger())
	}()
	stopWaiting()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("RunCleanup did not return while waiting for its interval")
	}

	// Invalid settings: nothing would ever be cleaned, so it says so and
	// returns instead of failing every interval.
	var logs bytes.Buffer
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		admin.RunCleanup(context.Background(), operate.Cleanup{Retention: time.Hour}, time.Millisecond, slog.New(slog.NewTextHandler(&logs, nil)))
	}()
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("RunCleanup with a zero batch size did not return")
	}
	require.Contains(t, logs.String(), "outbox cleanup not started")
}
