package inbox_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

// strictDecode is a consumer that reads schema version 1 only, as the
// consumer's code did when the record was parked.
func strictDecode(r *kgo.Record) (inbox.Event, error) {
	e, err := inbox.DecodeRecord(r)
	if err == nil && e.SchemaVersion != 1 {
		err = fmt.Errorf("%w: %s schema version %d is not supported", inbox.ErrInvalidEvent, e.Type, e.SchemaVersion)
	}
	return e, err
}

// fixedDecode is the same consumer after the fix: it reads version 2 too.
func fixedDecode(r *kgo.Record) (inbox.Event, error) { return inbox.DecodeRecord(r) }

// record is a fixture factory: the outbox's record of version v of
// aggregate agg, in schema version schema.
func record(agg string, v int64, schema int) *kgo.Record {
	r := cloudevents.Record("things", cloudevents.Event{
		ID: uuid.New(), Type: fmt.Sprintf("thing.step%d", v), Source: "urn:test", Time: time.Now(),
		AggregateType: "thing", AggregateID: agg, AggregateVersion: v, SchemaVersion: schema, Data: []byte(`{"n": 1}`),
	})
	r.Partition, r.Offset = 3, 40+v
	return r
}

// park runs r through decode as a consumer would, parks it when it fails,
// and returns the parked record's id.
func park(t *testing.T, f *fixture, r *kgo.Record, decode inbox.DecodeFunc) int64 {
	t.Helper()
	ctx := context.Background()
	_, err := decode(r)
	require.Error(t, err, "the fixture is meant to be parked")
	stored, err := inbox.ParkRecord(ctx, f.pool, r, err.Error())
	require.NoError(t, err)
	require.True(t, stored)
	var id int64
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT max(id) FROM inbox_parked_record").Scan(&id))
	return id
}

// retry runs RetryParked in a transaction of its own, as an operator's
// request does, and observes the result after the commit.
func retry(t *testing.T, f *fixture, id int64, decode inbox.DecodeFunc) (inbox.Retry, error) {
	t.Helper()
	var out inbox.Retry
	err := pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		var err error
		out, err = f.ib.RetryParked(context.Background(), tx, id, "alice", "reader of v2 deployed", decode)
		return err
	})
	if err == nil && out.Result.Outcome != "" {
		f.ib.Observe(out.Result)
	}
	return out, err
}

// TestRetryParked (O4, C6): a parked record is retried with the bytes it
// was parked with, through the inbox, with its own event id.
func TestRetryParked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// DecodableNow: parked because the consumer did not read schema
	// version 2; once it does, the retry applies it, the row records who
	// and what, and it is no longer counted as parked. Its event id is
	// the one it arrived with, so a redelivery afterwards is a duplicate.
	t.Run("DecodableNow", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Minute)
		r := record("a", 1, 2)
		id := park(t, f, r, strictDecode)
		st, err := f.ib.RefreshStats(ctx)
		require.NoError(t, err)
		require.Equal(t, int64(1), st.ParkedRecords)

		out, err := retry(t, f, id, fixedDecode)
		require.NoError(t, err)
		require.Equal(t, inbox.ResolutionApplied, out.Resolution)
		require.NoError(t, out.Err)
		require.Equal(t, inbox.Applied, out.Result.Outcome)
		require.Equal(t, []int64{1}, f.appliedVersions(t, "a"))
		require.Equal(t, inbox.ResolutionApplied, out.Record.Resolution)
		require.Equal(t, inbox.Applied, out.Record.RetryOutcome)
		require.Equal(t, "alice", out.Record.ResolvedBy)
		require.Equal(t, "reader of v2 deployed", out.Record.ResolutionNote)
		require.NotNil(t, out.Record.ResolvedAt)
		require.Equal(t, 1, out.Record.Retries)
		require.False(t, out.Record.Open())
		require.Len(t, out.BeforeSHA256, sha256.Size)
		require.NotEqual(t, out.BeforeSHA256, out.AfterSHA256)

		// The after hash is the row's, recomputable by anyone.
		var now []byte
		require.NoError(t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SET LOCAL TimeZone = 'UTC'")
			if err == nil {
				err = tx.QueryRow(ctx, "SELECT sha256(convert_to(to_jsonb(p)::text, 'UTF8')) FROM inbox_parked_record p WHERE id = $1", id).Scan(&now)
			}
			return err
		}))
		require.Equal(t, out.AfterSHA256, now)

		st, err = f.ib.RefreshStats(ctx)
		require.NoError(t, err)
		require.Zero(t, st.ParkedRecords, "a retried record is no longer parked")
		open, err := inbox.ParkedRecords(ctx, f.pool, inbox.ParkedListOptions{Limit: 10})
		require.NoError(t, err)
		require.Empty(t, open)

		e, err := fixedDecode(r)
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, f.handle(t, e).Outcome, "the retried event kept its identity")
		_, err = retry(t, f, id, fixedDecode)
		require.ErrorIs(t, err, inbox.ErrAlreadyResolved)
	})

	// StillFailing: retried before the fix, it stays parked with the new
	// reason and nothing of it is kept; retried again after, it applies.
	t.Run("StillFailing", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Minute)
		id := park(t, f, record("a", 1, 2), func(*kgo.Record) (inbox.Event, error) { return inbox.Event{}, errors.New("old reason") })

		out, err := retry(t, f, id, strictDecode)
		require.NoError(t, err, "still failing is an outcome, not an error")
		require.Equal(t, inbox.ResolutionStillFailing, out.Resolution)
		require.ErrorIs(t, out.Err, inbox.ErrInvalidEvent)
		require.Contains(t, out.Record.Reason, "schema version 2 is not supported", "the reason is the new one")
		require.True(t, out.Record.Open())
		require.Equal(t, 1, out.Record.Retries)
		require.NotEqual(t, out.BeforeSHA256, out.AfterSHA256)
		require.Empty(t, f.appliedVersions(t, "a"))
		require.Zero(t, f.count(t, "SELECT count(*) FROM processed_event"))
		st, err := f.ib.RefreshStats(ctx)
		require.NoError(t, err)
		require.Equal(t, int64(1), st.ParkedRecords)

		out, err = retry(t, f, id, fixedDecode)
		require.NoError(t, err)
		require.Equal(t, inbox.ResolutionApplied, out.Resolution)
		require.Equal(t, 2, out.Record.Retries)
		require.Equal(t, []int64{1}, f.appliedVersions(t, "a"))
	})

	// ProcessingUndone: the record decodes but its change still fails; the
	// processing is rolled back to a savepoint, so no marker of it is left
	// behind, and the resolution is still recorded in the same transaction.
	t.Run("ProcessingUndone", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Minute, withApply(func(next inbox.ApplyFunc) inbox.ApplyFunc {
			return func(context.Context, pgx.Tx, inbox.Event) error { return errors.New("projection bug") }
		}))
		id := park(t, f, record("a", 1, 2), strictDecode)
		out, err := retry(t, f, id, fixedDecode)
		require.NoError(t, err)
		require.Equal(t, inbox.ResolutionStillFailing, out.Resolution)
		require.ErrorContains(t, out.Err, "projection bug")
		require.Contains(t, out.Record.Reason, "projection bug")
		require.Zero(t, f.count(t, "SELECT count(*) FROM processed_event"), "nothing of the failed processing is kept")
		require.Zero(t, f.count(t, "SELECT count(*) FROM inbox_aggregate WHERE aggregate_id = 'a'"))
	})

	// Duplicate: the event was processed meanwhile (published again and
	// read by a fixed consumer); the retry is absorbed and says so.
	t.Run("Duplicate", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Minute)
		r := record("a", 1, 2)
		id := park(t, f, r, strictDecode)
		e, err := fixedDecode(r)
		require.NoError(t, err)
		require.Equal(t, inbox.Applied, f.handle(t, e).Outcome)
		out, err := retry(t, f, id, fixedDecode)
		require.NoError(t, err)
		require.Equal(t, inbox.ResolutionRetried, out.Resolution)
		require.Equal(t, inbox.Duplicate, out.Result.Outcome)
		require.Equal(t, []int64{1}, f.appliedVersions(t, "a"), "applied once")
	})

	// Transient: an infrastructure failure is the caller's to retry; the
	// transaction rolls back and the row is untouched.
	t.Run("Transient", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Minute, withApply(func(next inbox.ApplyFunc) inbox.ApplyFunc {
			return func(context.Context, pgx.Tx, inbox.Event) error { return &pgconn.PgError{Code: "40001"} }
		}))
		id := park(t, f, record("a", 1, 2), strictDecode)
		_, err := retry(t, f, id, fixedDecode)
		require.True(t, inbox.IsTransient(err), "got %v", err)
		p, err := inbox.ParkedRecordByID(ctx, f.pool, id)
		require.NoError(t, err)
		require.Empty(t, p.Resolution)
		require.Zero(t, p.Retries)
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Minute)
		_, err := retry(t, f, 4242, fixedDecode)
		require.ErrorIs(t, err, inbox.ErrParkedRecordNotFound)
		_, err = inbox.ParkedRecordByID(ctx, f.pool, 4242)
		require.ErrorIs(t, err, inbox.ErrParkedRecordNotFound)
	})

	t.Run("ActorRequired", func(t *testing.T) {
		t.Parallel()
		f := setup(t, time.Minute)
		id := park(t, f, record("a", 1, 2), strictDecode)
		err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			_, err := f.ib.RetryParked(ctx, tx, id, "", "note", fixedDecode)
			return err
		})
		require.ErrorContains(t, err, "an actor")
	})
}

// TestOperatorLists: parked records page by id and hide resolved ones
// unless asked; one record comes back with its exact bytes; parked held
// events and conflicts are listed without payloads.
func TestOperatorLists(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, time.Minute, withSnapshots(func(context.Context, string, string) (inbox.Snapshot, error) {
		return inbox.Snapshot{}, fmt.Errorf("%w: 404", inbox.ErrNotFound)
	}))
	hostile := record("a", 1, 2)
	hostile.Headers = append(hostile.Headers, kgo.RecordHeader{Key: "x-bin\x00", Value: []byte{0, 0xff}})
	hostile.Value = []byte{0xff, 0xfe}
	first := park(t, f, hostile, strictDecode)
	second := park(t, f, record("b", 1, 2), strictDecode)
	third := park(t, f, record("c", 1, 2), strictDecode)
	_, err := retry(t, f, second, fixedDecode)
	require.NoError(t, err)

	page, err := inbox.ParkedRecords(ctx, f.pool, inbox.ParkedListOptions{Limit: 10})
	require.NoError(t, err)
	require.Equal(t, []int64{first, third}, parkedIDs(page), "open records only")
	require.Nil(t, page[0].Value, "lists leave the bytes out")
	page, err = inbox.ParkedRecords(ctx, f.pool, inbox.ParkedListOptions{Limit: 1, IncludeResolved: true})
	require.NoError(t, err)
	require.Equal(t, []int64{first}, parkedIDs(page))
	page, err = inbox.ParkedRecords(ctx, f.pool, inbox.ParkedListOptions{After: first, Limit: 5, IncludeResolved: true})
	require.NoError(t, err)
	require.Equal(t, []int64{second, third}, parkedIDs(page))
	require.Equal(t, inbox.ResolutionApplied, page[0].Resolution)

	got, err := inbox.ParkedRecordByID(ctx, f.pool, first)
	require.NoError(t, err)
	require.Equal(t, hostile.Value, got.Value)
	require.Equal(t, hostile.Key, got.Key)
	require.Equal(t, hostile.Headers, got.Record().Headers, "headers come back byte for byte")
	require.Equal(t, "things", got.Topic)
	require.Equal(t, hostile.Offset, got.Offset)

	// A conflict, and held events that a 404 resync parks.
	owner := event("d", 1)
	f.handle(t, owner)
	rival := event("d", 1)
	require.Equal(t, inbox.Conflict, f.handle(t, rival).Outcome)
	f.handle(t, event("e", 2))
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, "UPDATE inbox_aggregate SET resync_after = now() - interval '1s' WHERE aggregate_id = 'e'")
	require.NoError(t, err)
	_, err = f.ib.ResyncDue(ctx, 10)
	require.NoError(t, err)

	conflicts, err := inbox.Conflicts(ctx, f.pool, 10)
	require.NoError(t, err)
	require.Len(t, conflicts, 1)
	require.Equal(t, rival.ID, conflicts[0].Event.ID)
	require.Equal(t, owner.ID, conflicts[0].ExistingEventID)
	parked, err := inbox.ParkedEvents(ctx, f.pool, 10)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, "e", parked[0].Event.AggregateID)
	require.Equal(t, int64(2), parked[0].Event.AggregateVersion)
	require.Contains(t, parked[0].Reason, "not found")
	require.Nil(t, parked[0].Event.Payload)
}

func parkedIDs(ps []inbox.ParkedRecord) []int64 {
	var out []int64
	for _, p := range ps {
		out = append(out, p.ID)
	}
	return out
}
