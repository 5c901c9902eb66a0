package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/inbox"
)

// withBatch gives the inbox a BatchApplyFunc: the fixture's Apply for a
// whole batch in one statement. calls counts the events it applied.
func withBatch(calls *int) option {
	return func(c *inbox.Config, _ *fixture) {
		c.ApplyBatch = func(ctx context.Context, tx pgx.Tx, events []inbox.Event) error {
			ids, aggs, versions := make([]uuid.UUID, len(events)), make([]string, len(events)), make([]int64, len(events))
			for i, e := range events {
				ids[i], aggs[i], versions[i] = e.ID, e.AggregateID, e.AggregateVersion
			}
			*calls += len(events)
			// WITH ORDINALITY keeps the batch's order in applied_log.seq.
			_, err := tx.Exec(ctx, `INSERT INTO applied_log (event_id, aggregate_id, version)
				SELECT id, agg, v FROM unnest($1::uuid[], $2::text[], $3::bigint[]) WITH ORDINALITY AS u(id, agg, v, n) ORDER BY n`,
				ids, aggs, versions)
			return err
		}
	}
}

// processBatch runs events through ProcessBatch in one transaction and
// returns the outcomes.
func (f *fixture) processBatch(t *testing.T, events ...inbox.Event) []string {
	t.Helper()
	var out []string
	require.NoError(t, pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		results, err := f.ib.ProcessBatch(context.Background(), tx, events)
		if err != nil {
			return err
		}
		for _, r := range results {
			out = append(out, string(r.Outcome))
		}
		return nil
	}))
	return out
}

// state returns, as JSON, the rows the inbox and the fixture's business
// wrote, without the times of writing.
func (f *fixture) state(t *testing.T) string {
	t.Helper()
	queries := map[string]string{
		"processed_event": `SELECT event_id, aggregate_id, aggregate_version, outcome FROM processed_event ORDER BY event_id`,
		"inbox_aggregate": `SELECT aggregate_id, last_version, gap_since IS NOT NULL AS gap FROM inbox_aggregate ORDER BY aggregate_id`,
		"held":            `SELECT event_id, aggregate_version, state FROM inbox_held_event ORDER BY event_id`,
		"conflict":        `SELECT event_id, existing_event_id FROM inbox_conflict ORDER BY event_id`,
		// Per aggregate, in the order the changes ran.
		"applied": `SELECT aggregate_id, array_agg(version ORDER BY seq) AS versions FROM applied_log GROUP BY aggregate_id ORDER BY aggregate_id`,
		"effects": `SELECT event_id, version, kind FROM effect_log ORDER BY event_id`,
	}
	out := map[string]json.RawMessage{}
	for k, q := range queries {
		var rows json.RawMessage
		require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT coalesce(json_agg(t), '[]') FROM (`+q+`) t`).Scan(&rows))
		out[k] = rows
	}
	b, err := json.Marshal(out)
	require.NoError(t, err)
	return string(b)
}

// TestProcessBatch: ProcessBatch has the outcomes and leaves the rows of
// Process called for each event in order, whether it takes the set-based
// path (ApplyBatch set) or not, across batches that mix plain next
// versions with redeliveries, a known event_id reused for another
// aggregate, gaps and their filling, a conflict and one event_id twice.
func TestProcessBatch(t *testing.T) {
	t.Parallel()
	a1, a2, a3, a4 := event("a", 1), event("a", 2), event("a", 3), event("a", 4)
	b1, b3 := event("b", 1), event("b", 3)
	b2 := event("b", 2)
	c1, c2 := event("c", 1), event("c", 2)
	cRival := event("c", 1)
	d1 := event("d", 1)
	d1.ID = a1.ID // a producer reusing an event_id for another aggregate
	d2 := event("d", 2)
	e1, e2 := event("e", 1), event("e", 2)
	f1 := event("f", 1)

	batches := [][]inbox.Event{
		{a1, a2, b1, b3, c1},
		{a2, a3, d1, d2, b2, cRival, c2, f1},
		{e1, e2, e2, a4},
	}
	run := func(setBased bool) ([][]string, string, int) {
		var calls int
		var opts []option
		if setBased {
			opts = append(opts, withBatch(&calls))
		}
		f := setup(t, time.Hour, opts...)
		var outcomes [][]string
		for _, batch := range batches {
			outcomes = append(outcomes, f.processBatch(t, batch...))
		}
		return outcomes, f.state(t), calls
	}
	perEvent, perEventState, _ := run(false)
	setBased, setBasedState, calls := run(true)
	require.Equal(t, perEvent, setBased)
	require.JSONEq(t, perEventState, setBasedState)
	require.Equal(t, [][]string{
		{"applied", "applied", "applied", "held", "applied"},
		{"duplicate", "applied", "duplicate", "held", "applied", "conflict", "applied", "applied"},
		{"applied", "applied", "duplicate", "applied"},
	}, perEvent)
	// First batch: a1, a2, b1, c1 (b3 is a gap). Second: f1 only, after the
	// markers were taken back once for d1's known event_id (a2 is a
	// redelivery, b has a held event, c a conflict, so their later events
	// go one by one too). Third: none, it holds one event_id twice.
	require.Equal(t, 5, calls, "the set-based path took the plain next versions")
}

// TestProcessBatchFailure: an error of ApplyBatch that names an event is
// reported as an *EventError with that event's index in the caller's batch.
func TestProcessBatchFailure(t *testing.T) {
	t.Parallel()
	bad := errors.New("refused")
	b1 := event("b", 1)
	f := setup(t, time.Hour, func(c *inbox.Config, _ *fixture) {
		c.ApplyBatch = func(_ context.Context, _ pgx.Tx, events []inbox.Event) error {
			for i, e := range events {
				if e.ID == b1.ID {
					return &inbox.EventError{Index: i, Err: bad}
				}
			}
			return nil
		}
	})
	held := event("a", 3) // goes one by one: a gap
	err := pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		_, err := f.ib.ProcessBatch(context.Background(), tx, []inbox.Event{held, event("c", 1), b1})
		return err
	})
	require.ErrorIs(t, err, bad)
	var ee *inbox.EventError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 2, ee.Index)
	require.Zero(t, f.count(t, "SELECT count(*) FROM processed_event"), "rolled back")
}
