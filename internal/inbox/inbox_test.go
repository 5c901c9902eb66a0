package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/inbox"
)

// The inbox's tests use a tiny "business" of their own, so they show the
// package works for any domain: apply appends the event to applied_log,
// and the effects owed to covered and rejected events go to effect_log
// (what a notifier would email).
const businessTables = `
CREATE TABLE applied_log (
	event_id uuid PRIMARY KEY, aggregate_id text NOT NULL, version bigint NOT NULL,
	seq bigint GENERATED ALWAYS AS IDENTITY);
CREATE TABLE effect_log (
	event_id uuid PRIMARY KEY, version bigint NOT NULL, kind text NOT NULL,
	seq bigint GENERATED ALWAYS AS IDENTITY);`

type fixture struct {
	pool  *pgxpool.Pool
	ib    *inbox.Inbox
	reg   *prometheus.Registry
	snaps []int64 // versions of the snapshots applied
}

type option func(*inbox.Config, *fixture)

// withSnapshots makes the source of truth answer with fetch.
func withSnapshots(fetch inbox.FetchFunc) option {
	return func(c *inbox.Config, f *fixture) {
		c.Fetch = fetch
		c.ApplySnapshot = func(ctx context.Context, tx pgx.Tx, s inbox.Snapshot) error {
			f.snaps = append(f.snaps, s.Version)
			return nil
		}
	}
}

func withApply(apply func(next inbox.ApplyFunc) inbox.ApplyFunc) option {
	return func(c *inbox.Config, _ *fixture) { c.Apply = apply(c.Apply) }
}

func withCovered(covered func(next inbox.ApplyFunc) inbox.ApplyFunc) option {
	return func(c *inbox.Config, _ *fixture) { c.Covered = covered(c.Covered) }
}

func setup(t testing.TB, window time.Duration, opts ...option) *fixture {
	t.Helper()
	db := newTestDB(t)
	_, err := db.Pool.Exec(context.Background(), businessTables)
	require.NoError(t, err)
	f := &fixture{pool: db.Pool, reg: prometheus.NewRegistry()}
	cfg := inbox.Config{
		Pool: db.Pool, GapWindow: window, ResyncRetry: window, Registerer: f.reg,
		Apply: func(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
			_, err := tx.Exec(ctx, "INSERT INTO applied_log (event_id, aggregate_id, version) VALUES ($1, $2, $3)", e.ID, e.AggregateID, e.AggregateVersion)
			return err
		},
		Covered: func(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
			_, err := tx.Exec(ctx, "INSERT INTO effect_log (event_id, version, kind) VALUES ($1, $2, 'covered')", e.ID, e.AggregateVersion)
			return err
		},
		Rejected: func(ctx context.Context, tx pgx.Tx, e inbox.Event, reason string) error {
			_, err := tx.Exec(ctx, "INSERT INTO effect_log (event_id, version, kind) VALUES ($1, $2, $3)", e.ID, e.AggregateVersion, "rejected:"+reason)
			return err
		},
	}
	for _, o := range opts {
		o(&cfg, f)
	}
	f.ib, err = inbox.New(cfg)
	require.NoError(t, err)
	return f
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
	res, err := f.ib.Handle(context.Background(), e)
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

// effects lists "kind:version" of every effect run, in order.
func (f *fixture) effects(t *testing.T) []string {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), "SELECT kind || ':' || version FROM effect_log ORDER BY seq")
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
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
		require.Equal(t, []string{"rejected:conflict:1"}, f.effects(t), "the conflict's own effects are accounted for once")
		// The conflicting event redelivered is recognised, not re-recorded.
		require.Equal(t, inbox.Duplicate, f.handle(t, other).Outcome)
		require.Equal(t, 1.0, counter(t, f.reg, "inbox_conflicts_total"))
		require.Equal(t, []int64{1}, f.appliedVersions(t, "a"))
		require.Len(t, f.effects(t), 1)
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
		require.Empty(t, f.effects(t), "nothing was covered")
	})

	t.Run("ApplyFailureRollsBackMarker", func(t *testing.T) {
		t.Parallel()
		boom := errors.New("boom")
		fail := true
		f := setup(t, time.Minute, withApply(func(next inbox.ApplyFunc) inbox.ApplyFunc {
			return func(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
				if err := next(ctx, tx, e); err != nil || !fail {
					return err
				}
				return boom
			}
		}))
		e := event("a", 1)
		_, err := f.ib.Handle(context.Background(), e)
		require.ErrorIs(t, err, boom)
		require.Equal(t, 0, f.count(t, "SELECT count(*) FROM processed_event"))
		require.Equal(t, 0, f.count(t, "SELECT count(*) FROM applied_log"))
		fail = false
		require.Equal(t, inbox.Applied, f.handle(t, e).Outcome)
		require.Equal(t, []int64{1}, f.appliedVersions(t, "a"))
		require.Zero(t, counter(t, f.reg, "inbox_duplicates_total"), "a rolled-back attempt is not counted")
	})

	// HeldEventFailingOnReleaseIsParked: when the missing version arrives
	// and a held successor's change fails for a reason of its own, that
	// successor is parked with the reason, and the arriving event is still
	// applied and committed; versions after the parked one stay held.
	t.Run("HeldEventFailingOnReleaseIsParked", func(t *testing.T) {
		t.Parallel()
		var poisoned uuid.UUID
		f := setup(t, time.Minute, withApply(func(next inbox.ApplyFunc) inbox.ApplyFunc {
			return func(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
				if e.ID == poisoned {
					return errors.New("payload refused by the business rules")
				}
				return next(ctx, tx, e)
			}
		}))
		f.handle(t, event("a", 1))
		v3, v4 := event("a", 3), event("a", 4)
		poisoned = v3.ID
		f.handle(t, v3)
		f.handle(t, v4)
		res := f.handle(t, event("a", 2))
		require.Equal(t, inbox.Applied, res.Outcome)
		require.Equal(t, []uuid.UUID{v3.ID}, ids(res.Parked))
		require.Equal(t, int64(2), res.LastVersion)
		require.Equal(t, []int64{1, 2}, f.appliedVersions(t, "a"))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_held_event WHERE event_id = $1 AND state = 'parked' AND park_reason LIKE '%refused by the business rules%'", v3.ID))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM processed_event WHERE event_id = $1 AND outcome = 'parked'", v3.ID))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_held_event WHERE event_id = $1 AND state = 'held'", v4.ID))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_aggregate WHERE gap_since IS NOT NULL"), "v4 still waits, so the gap stays open")
	})

	// TransientFailureOnReleaseFailsTheTransaction: an infrastructure error
	// while a held successor is applied says nothing about that event, so
	// it is not parked: the whole transaction fails and is retried.
	t.Run("TransientFailureOnReleaseFailsTheTransaction", func(t *testing.T) {
		t.Parallel()
		var flaky uuid.UUID
		f := setup(t, time.Minute, withApply(func(next inbox.ApplyFunc) inbox.ApplyFunc {
			return func(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
				if e.ID == flaky {
					return &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}
				}
				return next(ctx, tx, e)
			}
		}))
		f.handle(t, event("a", 1))
		v3 := event("a", 3)
		flaky = v3.ID
		f.handle(t, v3)
		v2 := event("a", 2)
		_, err := f.ib.Handle(context.Background(), v2)
		require.True(t, inbox.IsTransient(err), "%v", err)
		require.Equal(t, []int64{1}, f.appliedVersions(t, "a"), "all of it rolled back")
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_held_event WHERE state = 'held'"))
		flaky = uuid.Nil
		require.Equal(t, inbox.Applied, f.handle(t, v2).Outcome)
		require.Equal(t, []int64{1, 2, 3}, f.appliedVersions(t, "a"))
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
			res, err := f.ib.Process(ctx, tx, s.e)
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
		for name, e := range map[string]inbox.Event{
			"ZeroVersion":   event("a", 0),
			"NoID":          func() inbox.Event { e := event("a", 1); e.ID = uuid.Nil; return e }(),
			"NULInType":     func() inbox.Event { e := event("a", 1); e.Type = "x\x00"; return e }(),
			"BadUTF8Aggreg": func() inbox.Event { e := event("\xff", 1); return e }(),
		} {
			_, err := f.ib.Handle(context.Background(), e)
			require.ErrorIs(t, err, inbox.ErrInvalidEvent, name)
		}
	})
}

// heldIDs lists the events held now, by version: a source of truth that
// owns every one of them.
func heldIDs(t *testing.T, f *fixture) map[int64]uuid.UUID {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), "SELECT aggregate_version, event_id FROM inbox_held_event WHERE state = 'held'")
	require.NoError(t, err)
	out := map[int64]uuid.UUID{}
	for rows.Next() {
		var v int64
		var id uuid.UUID
		require.NoError(t, rows.Scan(&v, &id))
		out[v] = id
	}
	require.NoError(t, rows.Err())
	return out
}

func ids(evs []inbox.Event) []uuid.UUID {
	var out []uuid.UUID
	for _, e := range evs {
		out = append(out, e.ID)
	}
	return out
}

func TestResyncDue(t *testing.T) {
	t.Parallel()

	setupGap := func(t *testing.T, fetch inbox.FetchFunc, opts ...option) *fixture {
		f := setup(t, 50*time.Millisecond, append([]option{withSnapshots(fetch)}, opts...)...)
		f.handle(t, event("a", 1))
		f.handle(t, event("a", 3))
		f.handle(t, event("a", 4))
		require.Eventually(t, func() bool {
			st, err := f.ib.RefreshStats(context.Background())
			return err == nil && st.GapsOverdue == 1
		}, 5*time.Second, 20*time.Millisecond)
		return f
	}
	snapshotAt := func(v int64) inbox.FetchFunc {
		return func(_ context.Context, typ, id string) (inbox.Snapshot, error) {
			return inbox.Snapshot{AggregateType: typ, AggregateID: id, Version: v}, nil
		}
	}
	notFound := func(context.Context, string, string) (inbox.Snapshot, error) {
		return inbox.Snapshot{}, fmt.Errorf("%w: 404", inbox.ErrNotFound)
	}
	resync := func(t *testing.T, f *fixture) []inbox.Event {
		t.Helper()
		done, err := f.ib.ResyncDue(context.Background(), 10)
		require.NoError(t, err)
		return done
	}

	// requireStillOverdue checks the alert after a resync that did not
	// resolve the gap: the next attempt is scheduled later, but the gap is
	// still older than its window and the gauge must keep saying so.
	requireStillOverdue := func(t *testing.T, f *fixture) {
		st, err := f.ib.RefreshStats(context.Background())
		require.NoError(t, err)
		require.Equal(t, int64(1), st.GapsOverdue, "an unresolved gap stays overdue between resync attempts")
		require.Equal(t, 1.0, testutil.ToFloat64(f.ib.Metrics().GapsOverdue))
	}

	t.Run("NotDueBeforeWindow", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Hour, withSnapshots(func(context.Context, string, string) (inbox.Snapshot, error) {
			t.Error("fetched before the window passed")
			return inbox.Snapshot{}, nil
		}))
		f.handle(t, event("a", 1))
		f.handle(t, event("a", 3))
		require.Empty(t, resync(t, f))
	})

	// ContinuesFromSnapshotAndAppliesHeldThatFit: the source answers at
	// version 2 and lists v3 and v4 as its own, written after the order was
	// read; they follow the snapshot and are applied.
	t.Run("ContinuesFromSnapshotAndAppliesHeldThatFit", func(t *testing.T) {
		t.Parallel()
		var f *fixture
		f = setupGap(t, func(ctx context.Context, typ, id string) (inbox.Snapshot, error) {
			return inbox.Snapshot{AggregateType: typ, AggregateID: id, Version: 2, Events: heldIDs(t, f)}, nil
		})
		require.Len(t, resync(t, f), 2)
		require.Equal(t, []int64{2}, f.snaps)
		require.Equal(t, []int64{1, 3, 4}, f.appliedVersions(t, "a"), "v2 comes from the snapshot, v3 and v4 from the hold")
		require.Equal(t, 0, f.count(t, "SELECT count(*) FROM inbox_held_event"))
		require.Equal(t, 1.0, testutil.ToFloat64(f.ib.Metrics().Resyncs.WithLabelValues(inbox.ResyncOK)))
		require.Empty(t, f.effects(t))
	})

	// SnapshotAheadCoversHeld: held versions the snapshot covers never run
	// their state change, but each is handed to Covered, in order, so the
	// effects owed to it (a notification) are not lost. A late copy of a
	// covered version is a duplicate; the missing version arriving late is
	// itself covered.
	t.Run("SnapshotAheadCoversHeld", func(t *testing.T) {
		t.Parallel()
		f := setupGap(t, snapshotAt(5))
		require.Len(t, resync(t, f), 2)
		require.Equal(t, []int64{1}, f.appliedVersions(t, "a"), "held versions the snapshot covers are never applied")
		require.Equal(t, []string{"covered:3", "covered:4"}, f.effects(t))
		require.Equal(t, 2, f.count(t, "SELECT count(*) FROM processed_event WHERE outcome = 'superseded'"))

		// The missing version arriving late is held, and the source is
		// asked at once: nothing local can vouch for it any more (C7).
		late := event("a", 2)
		res := f.handle(t, late)
		require.Equal(t, inbox.Held, res.Outcome)
		require.Len(t, resync(t, f), 1)
		require.Equal(t, []string{"covered:3", "covered:4", "covered:2"}, f.effects(t))
		require.Equal(t, inbox.Duplicate, f.handle(t, late).Outcome, "covered once")
		// The late event now owns v2: another id at v2 is a conflict, so the
		// aggregate's history forked; v6 waits for a resync rather than
		// landing on top. This source cannot list its events, so the
		// conflict stays unverified, and v6, beyond the source's version 5,
		// can never become due: it is rejected rather than held for ever.
		require.Equal(t, inbox.Conflict, f.handle(t, event("a", 2)).Outcome)
		require.Equal(t, inbox.Held, f.handle(t, event("a", 6)).Outcome)
		require.Empty(t, resync(t, f))
		require.Equal(t, []int64{1}, f.appliedVersions(t, "a"))
		require.Equal(t, []string{"covered:3", "covered:4", "covered:2", "rejected:conflict:2", "rejected:impostor:6"}, f.effects(t))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_held_event WHERE state = 'rejected' AND aggregate_version = 6 AND park_reason LIKE '%beyond%'"))
		st, err := f.ib.RefreshStats(context.Background())
		require.NoError(t, err)
		require.Zero(t, st.GapsOverdue)
	})

	// CoveredFailureParksThatEvent: a held event whose own effect fails when
	// a snapshot covers it is kept, parked, and the resync still completes.
	t.Run("CoveredFailureParksThatEvent", func(t *testing.T) {
		t.Parallel()
		f := setupGap(t, snapshotAt(5), withCovered(func(next inbox.ApplyFunc) inbox.ApplyFunc {
			return func(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
				if e.AggregateVersion == 3 {
					return errors.New("cannot render this one")
				}
				return next(ctx, tx, e)
			}
		}))
		require.Len(t, resync(t, f), 1)
		require.Equal(t, []string{"covered:4"}, f.effects(t))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_held_event WHERE state = 'parked' AND aggregate_version = 3 AND park_reason LIKE '%cannot render%'"))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_aggregate WHERE last_version = 5 AND resync_after IS NULL"))
	})

	// HeldBeyondTheSourceIsRejected: the source is at version 1, so held
	// v3 and v4 were never written by it (a forged record, or a history a
	// restored producer lost). They can never become due: rejected, kept
	// for an operator, and the gap closes instead of alerting for ever.
	t.Run("HeldBeyondTheSourceIsRejected", func(t *testing.T) {
		t.Parallel()
		f := setupGap(t, snapshotAt(1))
		require.Empty(t, resync(t, f))
		require.Empty(t, f.snaps)
		require.Equal(t, 2, f.count(t, "SELECT count(*) FROM inbox_held_event WHERE state = 'rejected' AND park_reason LIKE '%beyond%'"))
		require.Equal(t, 2, f.count(t, "SELECT count(*) FROM processed_event WHERE outcome = 'rejected'"))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_aggregate WHERE resync_after IS NULL AND gap_since IS NULL"))
		require.Equal(t, []string{"rejected:impostor:3", "rejected:impostor:4"}, f.effects(t))
		require.Equal(t, 2.0, testutil.ToFloat64(f.ib.Metrics().Rejected.WithLabelValues(inbox.RejectImpostor)))
		st, err := f.ib.RefreshStats(context.Background())
		require.NoError(t, err)
		require.Zero(t, st.GapsOverdue)
		require.Zero(t, st.Held)
		// The real v2 still applies normally afterwards.
		require.Equal(t, inbox.Applied, f.handle(t, event("a", 2)).Outcome)
	})

	// HeldTheSourceWroteSinceKeepsWaiting: v3 and v4 are beyond the
	// snapshot's version but listed as the source's own (written after the
	// order was read): they stay held for a fresh window.
	t.Run("HeldTheSourceWroteSinceKeepsWaiting", func(t *testing.T) {
		t.Parallel()
		var f *fixture
		f = setupGap(t, func(ctx context.Context, typ, id string) (inbox.Snapshot, error) {
			return inbox.Snapshot{AggregateType: typ, AggregateID: id, Version: 1, Events: heldIDs(t, f)}, nil
		})
		require.Empty(t, resync(t, f))
		require.Equal(t, 2, f.count(t, "SELECT count(*) FROM inbox_held_event WHERE state = 'held'"))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_aggregate WHERE resync_after > clock_timestamp()"))
		require.Empty(t, f.effects(t))
	})

	t.Run("NotFoundParksHeld", func(t *testing.T) {
		t.Parallel()
		f := setupGap(t, notFound)
		resync(t, f)
		require.Equal(t, 2, f.count(t, "SELECT count(*) FROM inbox_held_event WHERE state = 'parked' AND park_reason LIKE '%not found%'"))
		require.Equal(t, 2, f.count(t, "SELECT count(*) FROM processed_event WHERE outcome = 'parked'"))
		require.Equal(t, []int64{1}, f.appliedVersions(t, "a"))
		require.Equal(t, []string{"rejected:not_found:3", "rejected:not_found:4"}, f.effects(t))
		st, err := f.ib.RefreshStats(context.Background())
		require.NoError(t, err)
		require.Equal(t, inbox.Stats{ParkedEvents: 2}, st)
	})

	t.Run("ParkedVersionStillOwned", func(t *testing.T) {
		t.Parallel()
		f := setupGap(t, notFound)
		resync(t, f)
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
		f := setupGap(t, func(context.Context, string, string) (inbox.Snapshot, error) {
			return inbox.Snapshot{}, errors.New("connection refused")
		})
		resync(t, f)
		require.Equal(t, 2, f.count(t, "SELECT count(*) FROM inbox_held_event WHERE state = 'held'"))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_aggregate WHERE resync_after > now()"))
		requireStillOverdue(t, f)
	})
}

// TestForkedHistory is what a restore of the producer's database looks
// like to a consumer: the producer lost versions the consumer applied and
// writes new events under the same versions. The first one is a conflict,
// and from then on the aggregate is diverged: its later versions are held
// instead of being applied on top of the lost history, and a resync makes
// the producer's current state the local one. The lost history's events and
// the conflicting ones stay duplicates afterwards, and the producer's next
// version applies normally.
func TestForkedHistory(t *testing.T) {
	t.Parallel()
	snapshotAt := func(v *int64) option {
		return withSnapshots(func(_ context.Context, typ, id string) (inbox.Snapshot, error) {
			return inbox.Snapshot{AggregateType: typ, AggregateID: id, Version: *v}, nil
		})
	}
	resync := func(t *testing.T, f *fixture) {
		t.Helper()
		_, err := f.ib.ResyncDue(context.Background(), 10)
		require.NoError(t, err)
	}

	// The producer was restored to v1; the consumer had applied v2.
	t.Run("LaterVersionWaitsForTheResync", func(t *testing.T) {
		t.Parallel()
		source := int64(3)
		f := setup(t, time.Hour, snapshotAt(&source))
		lost := []inbox.Event{event("a", 1), event("a", 2)}
		for _, e := range lost {
			require.Equal(t, inbox.Applied, f.handle(t, e).Outcome)
		}
		newV2, newV3 := event("a", 2), event("a", 3)
		res := f.handle(t, newV2)
		require.Equal(t, inbox.Conflict, res.Outcome)
		require.True(t, res.Diverged)
		res = f.handle(t, newV3)
		require.Equal(t, inbox.Held, res.Outcome, "not applied on top of the lost v2")
		require.True(t, res.Diverged)
		require.Equal(t, []int64{1, 2}, f.appliedVersions(t, "a"))

		resync(t, f) // due at once, not after the gap window
		require.Equal(t, []int64{3}, f.snaps, "the producer's state replaced the local one")
		require.Equal(t, []string{"rejected:conflict:2", "covered:3"}, f.effects(t), "the held v3's own effects still run")
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM processed_event WHERE outcome = 'forked'"), "the lost v2")
		require.Zero(t, f.count(t, "SELECT count(*) FROM inbox_aggregate WHERE diverged_at IS NOT NULL OR resync_after IS NOT NULL"))

		require.Equal(t, inbox.Applied, f.handle(t, event("a", 4)).Outcome, "the producer's next version")
		for _, e := range append(lost, newV2, newV3) {
			require.Equal(t, inbox.Duplicate, f.handle(t, e).Outcome, "v%d again", e.AggregateVersion)
		}
		require.Equal(t, []int64{1, 2, 4}, f.appliedVersions(t, "a"))
	})

	// The lost history went further (v4) than the producer has come since
	// (v2): the snapshot is below the lost history's version and still
	// replaces it, because the producer reached the fork.
	t.Run("SourceBelowTheLostHistory", func(t *testing.T) {
		t.Parallel()
		source := int64(2)
		f := setup(t, time.Hour, snapshotAt(&source))
		lost := []inbox.Event{event("a", 1), event("a", 2), event("a", 3), event("a", 4)}
		for _, e := range lost {
			f.handle(t, e)
		}
		require.Equal(t, inbox.Conflict, f.handle(t, event("a", 2)).Outcome)
		resync(t, f)
		require.Equal(t, []int64{2}, f.snaps)
		require.Equal(t, 3, f.count(t, "SELECT count(*) FROM processed_event WHERE outcome = 'forked'"))
		newV3 := event("a", 3)
		require.Equal(t, inbox.Applied, f.handle(t, newV3).Outcome)
		for _, e := range lost {
			require.Equal(t, inbox.Duplicate, f.handle(t, e).Outcome, "lost v%d again", e.AggregateVersion)
		}
		require.Equal(t, inbox.Applied, f.handle(t, event("a", 4)).Outcome)
		require.Equal(t, []int64{1, 2, 3, 4, 3, 4}, f.appliedVersions(t, "a"))
	})

	// A snapshot read from a replica that has not reached the fork yet is
	// not taken: the aggregate stays diverged and the resync is retried.
	t.Run("SnapshotBeforeTheForkIsStale", func(t *testing.T) {
		t.Parallel()
		source := int64(1)
		f := setup(t, 50*time.Millisecond, snapshotAt(&source))
		f.handle(t, event("a", 1))
		f.handle(t, event("a", 2))
		f.handle(t, event("a", 2))
		resync(t, f)
		require.Empty(t, f.snaps)
		require.Equal(t, inbox.Held, f.handle(t, event("a", 3)).Outcome)
		require.Equal(t, 1.0, testutil.ToFloat64(f.ib.Metrics().Resyncs.WithLabelValues(inbox.ResyncStale)))
		source = 3
		require.Eventually(t, func() bool { resync(t, f); return len(f.snaps) == 1 }, 5*time.Second, 20*time.Millisecond)
		require.Equal(t, []int64{1, 2}, f.appliedVersions(t, "a"), "v3 covered by the snapshot")
	})

	// Without a source of truth to ask, a conflict is recorded and later
	// versions apply as before: nothing could ever release them.
	t.Run("NoSourceOfTruth", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Hour)
		f.handle(t, event("a", 1))
		f.handle(t, event("a", 2))
		res := f.handle(t, event("a", 2))
		require.Equal(t, inbox.Conflict, res.Outcome)
		require.False(t, res.Diverged)
		require.Equal(t, inbox.Applied, f.handle(t, event("a", 3)).Outcome)
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

	n, err := f.ib.Cleanup(context.Background(), time.Hour, 3, time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, int64(7), n, "seven expired markers, in batches of three")
	require.Equal(t, 1, f.count(t, "SELECT count(*) FROM processed_event WHERE outcome = 'held'"))
	require.Equal(t, 1, f.count(t, "SELECT count(*) FROM processed_event WHERE outcome = 'applied'"))
	require.Equal(t, 7.0, counter(t, f.reg, "inbox_processed_events_cleaned_total"))

	_, err = f.ib.Cleanup(context.Background(), time.Hour, 0, 0)
	require.Error(t, err, "a batch of zero would never finish")
}

// TestCleanupOneRunnerAtATime: while one run holds the lock for its whole
// duration, another instance's run returns at once without deleting.
func TestCleanupOneRunnerAtATime(t *testing.T) {
	t.Parallel()
	f := setup(t, time.Minute)
	for i := range 5 {
		f.handle(t, event(fmt.Sprintf("agg-%d", i), 1))
	}
	_, err := f.pool.Exec(context.Background(), "UPDATE processed_event SET processed_at = now() - interval '2 hours'")
	require.NoError(t, err)
	other, err := pgx.Connect(context.Background(), f.pool.Config().ConnString())
	require.NoError(t, err)
	defer other.Close(context.Background())
	var locked bool
	require.NoError(t, other.QueryRow(context.Background(), "SELECT pg_try_advisory_lock(7215402114)").Scan(&locked))
	require.True(t, locked)

	n, err := f.ib.Cleanup(context.Background(), time.Hour, 2, 0)
	require.NoError(t, err)
	require.Zero(t, n, "another runner holds the lock")

	_, err = other.Exec(context.Background(), "SELECT pg_advisory_unlock(7215402114)")
	require.NoError(t, err)
	n, err = f.ib.Cleanup(context.Background(), time.Hour, 2, 0)
	require.NoError(t, err)
	require.Equal(t, int64(5), n)
}

func TestCheckRetention(t *testing.T) {
	t.Parallel()
	require.NoError(t, inbox.CheckRetention(30*24*time.Hour, 7*24*time.Hour, 14*24*time.Hour))
	require.NoError(t, inbox.CheckRetention(3*time.Hour, time.Hour, 2*time.Hour))
	err := inbox.CheckRetention(time.Hour, time.Hour, time.Minute)
	require.ErrorIs(t, err, inbox.ErrRetentionTooShort)
	require.ErrorContains(t, err, "the retention (1h0m0s) is shorter than the broker's redelivery window (1h0m0s) plus the backup retention (1m0s)")
}

func TestIsTransient(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		&pgconn.PgError{Code: "57P01"}, &pgconn.PgError{Code: "40001"}, &pgconn.PgError{Code: "08006"},
		context.DeadlineExceeded, fmt.Errorf("begin: %w", context.Canceled), fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "53300"}),
	} {
		require.True(t, inbox.IsTransient(err), "%v", err)
	}
	for _, err := range []error{
		nil, errors.New("bug"), &pgconn.PgError{Code: "23505"}, &pgconn.PgError{Code: "22021"}, inbox.ErrInvalidEvent,
	} {
		require.False(t, inbox.IsTransient(err), "%v", err)
	}
}
