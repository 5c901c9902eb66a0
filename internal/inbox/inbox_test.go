package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/inbox"
)

// The inbox's tests use a tiny "business" table of their own, so they show
// the package works for any domain: apply appends the event to a log.
const businessTable = `CREATE TABLE IF NOT EXISTS applied_log (
	event_id uuid PRIMARY KEY, aggregate_id text NOT NULL, version bigint NOT NULL,
	seq bigint GENERATED ALWAYS AS IDENTITY)`

type fixture struct {
	pool  *pgxpool.Pool
	ib    *inbox.Inbox
	reg   *prometheus.Registry
	apply inbox.ApplyFunc
}

func setup(t *testing.T, window time.Duration) *fixture {
	t.Helper()
	db := newTestDB(t)
	_, err := db.Pool.Exec(context.Background(), businessTable)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	ib, err := inbox.New(inbox.Config{GapWindow: window, ResyncRetry: window, Registerer: reg})
	require.NoError(t, err)
	return &fixture{pool: db.Pool, ib: ib, reg: reg, apply: func(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
		_, err := tx.Exec(ctx, "INSERT INTO applied_log (event_id, aggregate_id, version) VALUES ($1, $2, $3)", e.ID, e.AggregateID, e.AggregateVersion)
		return err
	}}
}

// event is a fixture factory: version v of aggregate agg, with a fresh id.
func event(agg string, v int64) inbox.Event {
	return inbox.Event{
		ID: uuid.New(), AggregateType: "thing", AggregateID: agg, AggregateVersion: v,
		Type: fmt.Sprintf("thing.step%d", v), SchemaVersion: 1, Time: time.Now(), Payload: []byte(`{}`),
	}
}

func (f *fixture) handle(t *testing.T, e inbox.Event) inbox.Result {
	t.Helper()
	res, err := f.ib.Handle(context.Background(), f.pool, e, f.apply)
	require.NoError(t, err)
	return res
}

func (f *fixture) appliedVersions(t *testing.T, agg string) []int64 {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), "SELECT version FROM applied_log WHERE aggregate_id = $1 ORDER BY seq", agg)
	require.NoError(t, err)
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return vs
}

func (f *fixture) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

func TestProcess(t *testing.T) {
	t.Parallel()

	t.Run("DuplicateByEventID", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Minute)
		e := event("a", 1)
		require.Equal(t, inbox.Applied, f.handle(t, e).Outcome)
		require.Equal(t, inbox.Duplicate, f.handle(t, e).Outcome)
		require.Equal(t, inbox.Duplicate, f.handle(t, e).Outcome)
		require.Equal(t, []int64{1}, f.appliedVersions(t, "a"))
		require.Equal(t, 2.0, counter(t, f.reg, "inbox_duplicates_total"))
	})

	t.Run("OlderVersionWithUnknownIDIsDuplicate", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Minute)
		f.handle(t, event("a", 1))
		f.handle(t, event("a", 2))
		// The marker of v1's owner exists, so a different id at v1 is a
		// conflict; but an id the inbox never saw, at a version nobody
		// owns any more (for example after TTL cleanup), is a duplicate.
		_, err := f.pool.Exec(context.Background(), "DELETE FROM processed_event WHERE aggregate_version = 1")
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, f.handle(t, event("a", 1)).Outcome)
		require.Equal(t, []int64{1, 2}, f.appliedVersions(t, "a"))
	})

	t.Run("ConflictAtAppliedVersion", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Minute)
		first := event("a", 1)
		f.handle(t, first)
		other := event("a", 1)
		res := f.handle(t, other)
		require.Equal(t, inbox.Conflict, res.Outcome)
		require.Equal(t, first.ID, res.ExistingEventID)
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_conflict WHERE event_id = $1 AND existing_event_id = $2", other.ID, first.ID))
		require.Equal(t, 1.0, counter(t, f.reg, "inbox_conflicts_total"))
		// The conflicting event redelivered is recognised, not re-recorded.
		require.Equal(t, inbox.Duplicate, f.handle(t, other).Outcome)
		require.Equal(t, 1.0, counter(t, f.reg, "inbox_conflicts_total"))
		require.Equal(t, []int64{1}, f.appliedVersions(t, "a"))
	})

	t.Run("ConflictAtHeldVersion", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Minute)
		f.handle(t, event("a", 1))
		held := event("a", 3)
		require.Equal(t, inbox.Held, f.handle(t, held).Outcome)
		res := f.handle(t, event("a", 3))
		require.Equal(t, inbox.Conflict, res.Outcome)
		require.Equal(t, held.ID, res.ExistingEventID)
		f.handle(t, event("a", 2))
		require.Equal(t, []int64{1, 2, 3}, f.appliedVersions(t, "a"))
	})

	t.Run("GapHeldThenDrainedInOrder", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Minute)
		f.handle(t, event("a", 1))
		e4, e3 := event("a", 4), event("a", 3)
		require.Equal(t, inbox.Held, f.handle(t, e4).Outcome)
		require.Equal(t, inbox.Held, f.handle(t, e3).Outcome)
		require.Equal(t, inbox.Duplicate, f.handle(t, e4).Outcome, "a held event redelivered is a duplicate")
		require.Equal(t, 2, f.count(t, "SELECT count(*) FROM inbox_held_event"))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_aggregate WHERE gap_since IS NOT NULL"))

		res := f.handle(t, event("a", 2))
		require.Equal(t, inbox.Applied, res.Outcome)
		require.Len(t, res.Applied, 3)
		require.Equal(t, int64(4), res.LastVersion)
		require.Equal(t, []int64{1, 2, 3, 4}, f.appliedVersions(t, "a"))
		require.Equal(t, 0, f.count(t, "SELECT count(*) FROM inbox_held_event"))
		require.Equal(t, 0, f.count(t, "SELECT count(*) FROM inbox_aggregate WHERE gap_since IS NOT NULL OR resync_after IS NOT NULL"))
		require.Equal(t, 2.0, counter(t, f.reg, "inbox_gaps_total"))
	})

	t.Run("ApplyFailureRollsBackMarker", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Minute)
		e := event("a", 1)
		boom := errors.New("boom")
		_, err := f.ib.Handle(context.Background(), f.pool, e, func(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
			require.NoError(t, f.apply(ctx, tx, e))
			return boom
		})
		require.ErrorIs(t, err, boom)
		require.Equal(t, 0, f.count(t, "SELECT count(*) FROM processed_event"))
		require.Equal(t, 0, f.count(t, "SELECT count(*) FROM applied_log"))
		require.Equal(t, inbox.Applied, f.handle(t, e).Outcome)
		require.Equal(t, []int64{1}, f.appliedVersions(t, "a"))
		require.Zero(t, counter(t, f.reg, "inbox_duplicates_total"), "a rolled-back attempt is not counted")
	})

	// SeveralInOneTransaction: a consumer that applies a batch of records
	// in one transaction calls Process once per event. Every decision reads
	// the state through the transaction, so a later call sees the earlier
	// ones' writes: the outcomes are those of separate transactions, and
	// nothing is counted before the commit.
	t.Run("SeveralInOneTransaction", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Minute)
		ctx := context.Background()
		v1, v2, v3, rival := event("a", 1), event("a", 2), event("a", 3), event("a", 1)
		b1 := event("b", 1)
		steps := []struct {
			e    inbox.Event
			want inbox.Outcome
			last int64
		}{
			{v1, inbox.Applied, 1},
			{b1, inbox.Applied, 1},
			{v3, inbox.Held, 1},
			{v3, inbox.Duplicate, 1}, // held earlier in this transaction
			{v2, inbox.Applied, 3},   // drains v3, held earlier in this transaction
			{v2, inbox.Duplicate, 3},
			{rival, inbox.Conflict, 3}, // v1 is owned by an event of this transaction
			{rival, inbox.Duplicate, 3},
			{b1, inbox.Duplicate, 1},
		}
		var results []inbox.Result
		tx, err := f.pool.Begin(ctx)
		require.NoError(t, err)
		for i, s := range steps {
			res, err := f.ib.Process(ctx, tx, s.e, f.apply)
			require.NoError(t, err, "step %d", i)
			require.Equal(t, s.want, res.Outcome, "step %d", i)
			require.Equal(t, s.last, res.LastVersion, "step %d", i)
			results = append(results, res)
		}
		require.Zero(t, counter(t, f.reg, "inbox_duplicates_total"), "nothing counted before the commit")
		require.NoError(t, tx.Commit(ctx))
		for _, r := range results {
			f.ib.Observe(r)
		}
		require.Equal(t, []int64{1, 2, 3}, f.appliedVersions(t, "a"))
		require.Equal(t, []int64{1}, f.appliedVersions(t, "b"))
		require.Equal(t, 4.0, counter(t, f.reg, "inbox_duplicates_total"))
		require.Equal(t, 1.0, counter(t, f.reg, "inbox_conflicts_total"))
		require.Equal(t, 1.0, counter(t, f.reg, "inbox_gaps_total"))
		require.Zero(t, f.count(t, "SELECT count(*) FROM inbox_held_event"))
		require.Zero(t, f.count(t, "SELECT count(*) FROM inbox_aggregate WHERE gap_since IS NOT NULL"))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_conflict WHERE event_id = $1 AND existing_event_id = $2", rival.ID, v1.ID))
	})

	t.Run("InvalidEvent", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Minute)
		_, err := f.ib.Handle(context.Background(), f.pool, event("a", 0), f.apply)
		require.ErrorIs(t, err, inbox.ErrInvalidEvent)
	})
}

func TestResyncDue(t *testing.T) {
	t.Parallel()

	type snapState struct{ version int64 }
	setupGap := func(t *testing.T) *fixture {
		f := setup(t, 50*time.Millisecond)
		f.handle(t, event("a", 1))
		f.handle(t, event("a", 3))
		f.handle(t, event("a", 4))
		return f
	}
	resync := func(f *fixture, fetch func(context.Context, string, string) (inbox.Snapshot, error), snapshots *[]int64) inbox.Resync {
		return inbox.Resync{
			Fetch: fetch,
			ApplySnapshot: func(ctx context.Context, tx pgx.Tx, s inbox.Snapshot) error {
				*snapshots = append(*snapshots, s.State.(snapState).version)
				return nil
			},
			Apply: f.apply,
		}
	}
	waitDue := func(t *testing.T, f *fixture) {
		require.Eventually(t, func() bool {
			st, err := f.ib.RefreshStats(context.Background(), f.pool)
			return err == nil && st.GapsOverdue == 1
		}, 5*time.Second, 20*time.Millisecond)
	}

	// requireStillOverdue checks the alert after a resync that did not
	// resolve the gap: the next attempt is scheduled later, but the gap is
	// still older than its window and the gauge must keep saying so.
	requireStillOverdue := func(t *testing.T, f *fixture) {
		st, err := f.ib.RefreshStats(context.Background(), f.pool)
		require.NoError(t, err)
		require.Equal(t, int64(1), st.GapsOverdue, "an unresolved gap stays overdue between resync attempts")
		require.Equal(t, 1.0, testutil.ToFloat64(f.ib.Metrics().GapsOverdue))
	}

	t.Run("NotDueBeforeWindow", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Hour)
		f.handle(t, event("a", 1))
		f.handle(t, event("a", 3))
		var snaps []int64
		applied, err := f.ib.ResyncDue(context.Background(), f.pool, resync(f, func(context.Context, string, string) (inbox.Snapshot, error) {
			t.Fatal("fetched before the window passed")
			return inbox.Snapshot{}, nil
		}, &snaps), 10)
		require.NoError(t, err)
		require.Empty(t, applied)
	})

	t.Run("ContinuesFromSnapshotAndAppliesHeldThatFit", func(t *testing.T) {
		t.Parallel()
		f := setupGap(t)
		waitDue(t, f)
		var snaps []int64
		applied, err := f.ib.ResyncDue(context.Background(), f.pool, resync(f, func(_ context.Context, typ, id string) (inbox.Snapshot, error) {
			return inbox.Snapshot{AggregateType: typ, AggregateID: id, Version: 2, State: snapState{2}}, nil
		}, &snaps), 10)
		require.NoError(t, err)
		require.Equal(t, []int64{2}, snaps)
		require.Len(t, applied, 2)
		require.Equal(t, []int64{1, 3, 4}, f.appliedVersions(t, "a"), "v2 comes from the snapshot, v3 and v4 from the hold")
		require.Equal(t, 0, f.count(t, "SELECT count(*) FROM inbox_held_event"))
		require.Equal(t, 1.0, testutil.ToFloat64(f.ib.Metrics().Resyncs.WithLabelValues(inbox.ResyncOK)))
	})

	t.Run("SnapshotAheadSupersedesHeld", func(t *testing.T) {
		t.Parallel()
		f := setupGap(t)
		waitDue(t, f)
		var snaps []int64
		_, err := f.ib.ResyncDue(context.Background(), f.pool, resync(f, func(_ context.Context, typ, id string) (inbox.Snapshot, error) {
			return inbox.Snapshot{AggregateType: typ, AggregateID: id, Version: 5, State: snapState{5}}, nil
		}, &snaps), 10)
		require.NoError(t, err)
		require.Equal(t, []int64{1}, f.appliedVersions(t, "a"), "held versions the snapshot covers are never applied")
		require.Equal(t, 2, f.count(t, "SELECT count(*) FROM processed_event WHERE outcome = 'superseded'"))
		// Late copies, old or held, never move state backwards.
		require.Equal(t, inbox.Duplicate, f.handle(t, event("a", 2)).Outcome)
		require.Equal(t, inbox.Applied, f.handle(t, event("a", 6)).Outcome)
		require.Equal(t, []int64{1, 6}, f.appliedVersions(t, "a"))
	})

	t.Run("StaleSnapshotKeepsHolding", func(t *testing.T) {
		t.Parallel()
		f := setupGap(t)
		waitDue(t, f)
		var snaps []int64
		_, err := f.ib.ResyncDue(context.Background(), f.pool, resync(f, func(_ context.Context, typ, id string) (inbox.Snapshot, error) {
			return inbox.Snapshot{AggregateType: typ, AggregateID: id, Version: 1, State: snapState{1}}, nil
		}, &snaps), 10)
		require.NoError(t, err)
		require.Empty(t, snaps)
		require.Equal(t, 2, f.count(t, "SELECT count(*) FROM inbox_held_event WHERE state = 'held'"))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_aggregate WHERE resync_attempts = 1 AND last_resync_error LIKE '%not ahead%'"))
		require.Equal(t, 1.0, testutil.ToFloat64(f.ib.Metrics().Resyncs.WithLabelValues(inbox.ResyncStale)))
		requireStillOverdue(t, f)
	})

	t.Run("NotFoundParksHeld", func(t *testing.T) {
		t.Parallel()
		f := setupGap(t)
		waitDue(t, f)
		var snaps []int64
		_, err := f.ib.ResyncDue(context.Background(), f.pool, resync(f, func(context.Context, string, string) (inbox.Snapshot, error) {
			return inbox.Snapshot{}, fmt.Errorf("%w: 404", inbox.ErrNotFound)
		}, &snaps), 10)
		require.NoError(t, err)
		require.Equal(t, 2, f.count(t, "SELECT count(*) FROM inbox_held_event WHERE state = 'parked' AND park_reason LIKE '%not found%'"))
		require.Equal(t, 2, f.count(t, "SELECT count(*) FROM processed_event WHERE outcome = 'parked'"))
		require.Equal(t, []int64{1}, f.appliedVersions(t, "a"))
		st, err := f.ib.RefreshStats(context.Background(), f.pool)
		require.NoError(t, err)
		require.Equal(t, inbox.Stats{ParkedEvents: 2}, st)
	})

	t.Run("ParkedVersionStillOwned", func(t *testing.T) {
		t.Parallel()
		f := setupGap(t)
		waitDue(t, f)
		var snaps []int64
		_, err := f.ib.ResyncDue(context.Background(), f.pool, resync(f, func(context.Context, string, string) (inbox.Snapshot, error) {
			return inbox.Snapshot{}, fmt.Errorf("%w: 404", inbox.ErrNotFound)
		}, &snaps), 10)
		require.NoError(t, err)
		// The gap fills; v3 is parked, so the aggregate waits at v2.
		require.Equal(t, inbox.Applied, f.handle(t, event("a", 2)).Outcome)
		require.Equal(t, []int64{1, 2}, f.appliedVersions(t, "a"))
		// A different event now claiming v3 conflicts with the parked one.
		res := f.handle(t, event("a", 3))
		require.Equal(t, inbox.Conflict, res.Outcome)
		require.Equal(t, []int64{1, 2}, f.appliedVersions(t, "a"), "never applied over the parked event")
	})

	t.Run("FetchErrorRetriesLater", func(t *testing.T) {
		t.Parallel()
		f := setupGap(t)
		waitDue(t, f)
		var snaps []int64
		_, err := f.ib.ResyncDue(context.Background(), f.pool, resync(f, func(context.Context, string, string) (inbox.Snapshot, error) {
			return inbox.Snapshot{}, errors.New("connection refused")
		}, &snaps), 10)
		require.NoError(t, err)
		require.Equal(t, 2, f.count(t, "SELECT count(*) FROM inbox_held_event WHERE state = 'held'"))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_aggregate WHERE resync_after > now()"))
		requireStillOverdue(t, f)
	})
}

func TestCleanup(t *testing.T) {
	t.Parallel()
	f := setup(t, time.Minute)
	for i := range 7 {
		f.handle(t, event(fmt.Sprintf("agg-%d", i), 1))
	}
	f.handle(t, event("agg-0", 3)) // held: must survive any TTL
	_, err := f.pool.Exec(context.Background(), "UPDATE processed_event SET processed_at = now() - interval '2 hours'")
	require.NoError(t, err)
	f.handle(t, event("agg-1", 2)) // recent: must survive

	n, err := f.ib.Cleanup(context.Background(), f.pool, time.Hour, 3)
	require.NoError(t, err)
	require.Equal(t, int64(7), n, "seven expired markers, in batches of three")
	require.Equal(t, 1, f.count(t, "SELECT count(*) FROM processed_event WHERE outcome = 'held'"))
	require.Equal(t, 1, f.count(t, "SELECT count(*) FROM processed_event WHERE outcome = 'applied'"))
	require.Equal(t, 7.0, counter(t, f.reg, "inbox_processed_events_cleaned_total"))
}

func TestCheckRetention(t *testing.T) {
	t.Parallel()
	require.NoError(t, inbox.CheckRetention(30*24*time.Hour, 7*24*time.Hour, 14*24*time.Hour))
	require.NoError(t, inbox.CheckRetention(3*time.Hour, time.Hour, 2*time.Hour))
	err := inbox.CheckRetention(time.Hour, time.Hour, time.Minute)
	require.ErrorIs(t, err, inbox.ErrRetentionTooShort)
	require.ErrorContains(t, err, "PROCESSED_EVENT_TTL=1h0m0s")
}

func TestParkRecord(t *testing.T) {
	t.Parallel()
	f := setup(t, time.Minute)
	rec := inbox.Record{Source: "topic", Partition: 2, Offset: 9, Key: []byte("k"), Value: []byte("\xff garbage"),
		Headers: []inbox.Header{inbox.NewHeader("ce_id", []byte("x")), inbox.NewHeader("bin", []byte{0xff})}, Reason: "bad"}
	stored, err := inbox.ParkRecord(context.Background(), f.pool, rec)
	require.NoError(t, err)
	require.True(t, stored)
	stored, err = inbox.ParkRecord(context.Background(), f.pool, rec)
	require.NoError(t, err)
	require.False(t, stored, "the same position is parked once")
	var value []byte
	var headers string
	require.NoError(t, f.pool.QueryRow(context.Background(), "SELECT record_value, headers::text FROM inbox_parked_record").Scan(&value, &headers))
	require.Equal(t, rec.Value, value)
	require.JSONEq(t, `[{"key":"ce_id","value":"x"},{"key":"bin","binary":"/w=="}]`, headers)
}
