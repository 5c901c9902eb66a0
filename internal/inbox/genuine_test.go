package inbox_test

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/inbox"
)

// source is a source of truth that knows which event it wrote at each
// version of aggregate "a".
type source struct {
	mu      sync.Mutex
	version int64
	events  map[int64]uuid.UUID
}

func newSource() *source { return &source{events: map[int64]uuid.UUID{}} }

// write records e as the source's own event and returns it.
func (s *source) write(e inbox.Event) inbox.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events[e.AggregateVersion] = e.ID
	s.version = max(s.version, e.AggregateVersion)
	return e
}

func (s *source) fetch(_ context.Context, typ, id string) (inbox.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return inbox.Snapshot{AggregateType: typ, AggregateID: id, Version: s.version, Events: maps.Clone(s.events)}, nil
}

// TestOnlyGenuineEventsTakeAVersion covers C7: whichever arrives first, the
// source of truth's event at a version is the one whose effects run, once,
// and a record that only claims the version is rejected and kept.
func TestOnlyGenuineEventsTakeAVersion(t *testing.T) {
	t.Parallel()
	resync := func(t *testing.T, f *fixture) []inbox.Event {
		t.Helper()
		done, err := f.ib.ResyncDue(context.Background(), 10)
		require.NoError(t, err)
		return done
	}

	// ImpostorAfterTheGenuineEvent: the impostor conflicts with the applied
	// v2; the source confirms the local history, the impostor is rejected,
	// and nothing is rebased: v3 then applies as usual.
	t.Run("ImpostorAfterTheGenuineEvent", func(t *testing.T) {
		t.Parallel()
		src := newSource()
		f := setup(t, time.Hour, withSnapshots(src.fetch))
		f.handle(t, src.write(event("a", 1)))
		f.handle(t, src.write(event("a", 2)))
		impostor := event("a", 2)
		res := f.handle(t, impostor)
		require.Equal(t, inbox.Conflict, res.Outcome)
		require.Empty(t, f.effects(t), "no verdict before the source is asked")

		require.Empty(t, resync(t, f))
		require.Empty(t, f.snaps, "the local history is the source's: nothing to rebase")
		require.Equal(t, []string{"rejected:impostor:2"}, f.effects(t))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_conflict WHERE event_id = $1 AND resolution = 'impostor'", impostor.ID))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM processed_event WHERE event_id = $1 AND outcome = 'rejected'", impostor.ID))
		require.Equal(t, 1.0, testutil.ToFloat64(f.ib.Metrics().Rejected.WithLabelValues(inbox.RejectImpostor)))

		require.Equal(t, inbox.Applied, f.handle(t, src.write(event("a", 3))).Outcome)
		require.Equal(t, []int64{1, 2, 3}, f.appliedVersions(t, "a"))
		require.Equal(t, inbox.Duplicate, f.handle(t, impostor).Outcome, "a redelivered impostor changes nothing")
	})

	// ImpostorBeforeTheGenuineEvent: the impostor took v2 first; the genuine
	// v2 conflicts with it. The source says the genuine one is real: state
	// follows the source's snapshot, the genuine event's own effects run
	// (covered), once, and the impostor's version is retired.
	t.Run("ImpostorBeforeTheGenuineEvent", func(t *testing.T) {
		t.Parallel()
		src := newSource()
		f := setup(t, time.Hour, withSnapshots(src.fetch))
		f.handle(t, src.write(event("a", 1)))
		impostor := event("a", 2)
		require.Equal(t, inbox.Applied, f.handle(t, impostor).Outcome)
		genuine := src.write(event("a", 2))
		require.Equal(t, inbox.Conflict, f.handle(t, genuine).Outcome)

		require.Len(t, resync(t, f), 1)
		require.Equal(t, []int64{2}, f.snaps, "the forked state is replaced by the source's")
		require.Equal(t, []string{"covered:2"}, f.effects(t), "the genuine event's effects run once")
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_conflict WHERE event_id = $1 AND resolution = 'genuine'", genuine.ID))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM processed_event WHERE event_id = $1 AND outcome = 'forked'", impostor.ID))
		require.Equal(t, inbox.Duplicate, f.handle(t, genuine).Outcome)
		require.Empty(t, resync(t, f))
		require.Equal(t, []string{"covered:2"}, f.effects(t), "and never again")
		require.Equal(t, inbox.Applied, f.handle(t, src.write(event("a", 3))).Outcome)
	})

	// LateEventsAreVouchedForByTheSource: a snapshot placed v2 (never received). A
	// record arriving later for v2 cannot be vouched for by local state, so
	// the source is asked: its own event is covered, an impostor rejected.
	t.Run("LateEventsAreVouchedForByTheSource", func(t *testing.T) {
		t.Parallel()
		src := newSource()
		f := setup(t, 50*time.Millisecond, withSnapshots(src.fetch))
		f.handle(t, src.write(event("a", 1)))
		late := src.write(event("a", 2))
		f.handle(t, src.write(event("a", 3)))
		require.Eventually(t, func() bool { return len(resync(t, f)) == 1 }, 5*time.Second, 20*time.Millisecond)
		require.Equal(t, []string{"covered:3"}, f.effects(t))

		impostor := event("a", 2)
		require.Equal(t, inbox.Held, f.handle(t, impostor).Outcome)
		require.Equal(t, inbox.Conflict, f.handle(t, late).Outcome, "one event waits per version; the source decides")
		require.Len(t, resync(t, f), 1)
		require.Equal(t, []string{"covered:3", "covered:2", "rejected:impostor:2"}, f.effects(t))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_held_event WHERE event_id = $1 AND state = 'rejected'", impostor.ID))
		require.Equal(t, inbox.Applied, f.handle(t, src.write(event("a", 4))).Outcome, "nothing forked, nothing held")

		// An impostor alone at a placed version is rejected too.
		alone := event("a", 1)
		require.Equal(t, inbox.Conflict, f.handle(t, alone).Outcome, "v1 is owned: a conflict")
		other := event("a", 2)
		require.Equal(t, inbox.Conflict, f.handle(t, other).Outcome, "v2 is owned by the covered genuine event now")
		require.Empty(t, resync(t, f))
		require.Equal(t, []string{"covered:3", "covered:2", "rejected:impostor:2", "rejected:impostor:1", "rejected:impostor:2"}, f.effects(t))
		st, err := f.ib.RefreshStats(context.Background())
		require.NoError(t, err)
		require.Zero(t, st.GapsOverdue)
	})

	// DropHeld: an operator drops a held event for good, before any resync
	// has judged it.
	t.Run("DropHeld", func(t *testing.T) {
		t.Parallel()
		src := newSource()
		f := setup(t, time.Hour, withSnapshots(src.fetch))
		f.handle(t, src.write(event("a", 1)))
		forged := event("a", 6)
		require.Equal(t, inbox.Held, f.handle(t, forged).Outcome)

		tx, err := f.pool.Begin(context.Background())
		require.NoError(t, err)
		dropped, err := f.ib.DropHeld(context.Background(), tx, forged.ID, "ops", "forged: the order never had a version 6")
		require.NoError(t, err)
		require.NoError(t, tx.Commit(context.Background()))
		dropped.Observe()
		require.Equal(t, forged.ID, dropped.Event.ID)
		require.Len(t, dropped.BeforeSHA256, 32)
		require.NotEqual(t, dropped.BeforeSHA256, dropped.AfterSHA256)
		require.Equal(t, []string{"rejected:dropped:6"}, f.effects(t))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_held_event WHERE event_id = $1 AND state = 'rejected' AND rejected_by = 'ops' AND park_reason LIKE '%forged%'", forged.ID))
		require.Equal(t, 1, f.count(t, "SELECT count(*) FROM inbox_aggregate WHERE gap_since IS NULL AND resync_after IS NULL"))
		require.Equal(t, 1.0, testutil.ToFloat64(f.ib.Metrics().Rejected.WithLabelValues(inbox.RejectDropped)))

		tx, err = f.pool.Begin(context.Background())
		require.NoError(t, err)
		defer tx.Rollback(context.Background())
		_, err = f.ib.DropHeld(context.Background(), tx, forged.ID, "ops", "again")
		require.ErrorIs(t, err, inbox.ErrHeldEventNotFound)
		_, err = f.ib.DropHeld(context.Background(), tx, uuid.New(), "ops", "never held")
		require.ErrorIs(t, err, inbox.ErrHeldEventNotFound)
		require.Equal(t, inbox.Duplicate, f.handle(t, forged).Outcome, "a dropped event stays recognised")
	})
}
