package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/internal/eventtypes"
	"github.com/outboxref/orders/internal/outbox/internal/outboxtest"
)

// TestWriterRefuses (L2): each kind of event the relay could not deliver,
// or the database could not store, is refused with a typed error before
// any statement runs. Nothing is written, and the caller's transaction
// stays usable: a valid event can still be inserted in it.
func TestWriterRefuses(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	// The Writer checks payloads against their schemas on insert too.
	checking, err := outbox.NewWriter(outboxtest.Types(), outbox.WithSchemaCheckOnInsert())
	require.NoError(t, err)
	set := func(mod func(*outbox.Event)) func(string) []outbox.Event {
		return func(agg string) []outbox.Event { return []outbox.Event{event(agg, 1, mod)} }
	}
	for _, tc := range []struct {
		name   string
		events func(agg string) []outbox.Event
		index  int    // of the refused event
		field  string // InvalidEventError.Field
		kind   error  // the specific sentinel, if any
	}{
		{"EmptyType", set(func(e *outbox.Event) { e.Type = "" }), 0, "Type", nil},
		{"EmptyAggregateType", set(func(e *outbox.Event) { e.AggregateType = "" }), 0, "AggregateType", nil},
		{"EmptyAggregateID", set(func(e *outbox.Event) { e.AggregateID = "" }), 0, "AggregateID", nil},
		{"VersionZero", set(func(e *outbox.Event) { e.AggregateVersion = 0 }), 0, "AggregateVersion", nil},
		{"VersionNegative", set(func(e *outbox.Event) { e.AggregateVersion = -1 }), 0, "AggregateVersion", nil},
		{"SchemaVersionZero", set(func(e *outbox.Event) { e.SchemaVersion = 0 }), 0, "SchemaVersion", nil},
		{"UnregisteredType", set(func(e *outbox.Event) { e.Type = "test.unknown" }), 0, "Type", outbox.ErrUnknownEventType},
		{"UnregisteredSchemaVersion", set(func(e *outbox.Event) { e.SchemaVersion = 2 }), 0, "SchemaVersion", outbox.ErrUnknownSchemaVersion},
		{"PayloadMissing", set(func(e *outbox.Event) { e.Payload = nil }), 0, "Payload", nil},
		{"PayloadNotJSON", set(withPayload(`{"n": 1`)), 0, "Payload", nil},
		{"PayloadTrailingData", set(withPayload(`{"n": 1} {}`)), 0, "Payload", nil},
		{"PayloadFailsSchema", set(withPayload(`{"n": "secret-value"}`)), 0, "Payload", nil},
		{"PayloadExtraProperty", set(withPayload(`{"n": 1, "secret-key": true}`)), 0, "Payload", nil},
		{"PayloadTooLarge", set(withPayload(`{"n": 1, "blob": "` + strings.Repeat("x", outbox.MaxPayloadBytes) + `"}`)), 0, "Payload", outbox.ErrPayloadTooLarge},
		// Valid JSON that PostgreSQL's jsonb refuses: the INSERT would fail.
		{"PayloadNULEscape", set(withPayload(`{"n": 1, "blob": "a\u0000b"}`)), 0, "Payload", nil},
		{"PayloadLoneHighSurrogate", set(withPayload(`{"n": 1, "blob": "\ud800x"}`)), 0, "Payload", nil},
		{"PayloadLoneLowSurrogate", set(withPayload(`{"n": 1, "blob": "\udc00"}`)), 0, "Payload", nil},
		{"PayloadInvalidUTF8", set(withPayload("{\"n\": 1, \"blob\": \"\xff\"}")), 0, "Payload", nil},
		// Text that PostgreSQL text columns or the record headers cannot
		// carry, within cloudevents' bounds.
		{"NULInAggregateID", set(func(e *outbox.Event) { e.AggregateID += "\x00" }), 0, "AggregateID", nil},
		{"InvalidUTF8InType", set(func(e *outbox.Event) { e.Type = "test.\xff" }), 0, "Type", nil},
		{"ControlCharacterInAggregateType", set(func(e *outbox.Event) { e.AggregateType = "te\nst" }), 0, "AggregateType", nil},
		{"AggregateIDTooLong", set(func(e *outbox.Event) { e.AggregateID = strings.Repeat("a", 1025) }), 0, "AggregateID", nil},
		{"MalformedTraceparent", set(func(e *outbox.Event) { e.Traceparent = "00-abc\x00" }), 0, "Traceparent", nil},
		{"TracestateWithoutTraceparent", set(func(e *outbox.Event) { e.Tracestate = "vendor=1" }), 0, "Tracestate", nil},
		{"TracestateTooLong", set(func(e *outbox.Event) {
			e.Traceparent, e.Tracestate = testTraceparent, "v="+strings.Repeat("a", 511)
		}), 0, "Tracestate", nil},
		// Within one call (W4).
		{"VersionGapInOneCall", func(agg string) []outbox.Event { return []outbox.Event{event(agg, 1), event(agg, 3)} }, 1, "AggregateVersion", nil},
		{"VersionTwiceInOneCall", func(agg string) []outbox.Event { return []outbox.Event{event(agg, 1), event(agg, 1)} }, 1, "AggregateVersion", nil},
		{"EventIDTwiceInOneCall", func(agg string) []outbox.Event {
			id := uuid.New()
			return []outbox.Event{event(agg, 1, withID(id)), event(agg+"-b", 1, withID(id))}
		}, 1, "ID", nil},
		{"OneBadEventRefusesTheCall", func(agg string) []outbox.Event {
			return []outbox.Event{event(agg, 1), event(agg, 2, withPayload(`{}`))}
		}, 1, "Payload", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx) //nolint:errcheck // the test never commits

			agg := "agg-" + tc.name
			events := tc.events(agg)
			err = checking.Insert(ctx, tx, events)

			require.ErrorIs(t, err, outbox.ErrInvalidEvent)
			var ie *outbox.InvalidEventError
			require.ErrorAs(t, err, &ie)
			require.Equal(t, tc.index, ie.Index)
			require.Equal(t, tc.field, ie.Field, "reason: %s", ie.Reason)
			if tc.kind != nil {
				require.ErrorIs(t, err, tc.kind)
			}
			for _, other := range []error{outbox.ErrPayloadTooLarge, outbox.ErrUnknownEventType, outbox.ErrUnknownSchemaVersion} {
				if other != tc.kind {
					require.NotErrorIs(t, err, other)
				}
			}
			require.NotContains(t, err.Error(), "secret", "the error never quotes a payload")
			require.Zero(t, countIn(t, tx), "nothing written")
			for _, ev := range events {
				if tc.name != "EventIDTwiceInOneCall" {
					require.Equal(t, uuid.Nil, ev.ID, "a refused call fills in no IDs")
				}
			}

			// The refusal sent nothing to PostgreSQL, so the transaction is
			// not aborted: the caller may go on, or roll back.
			valid := []outbox.Event{event(agg+"-valid", 1)}
			require.NoError(t, checking.Insert(ctx, tx, valid))
			require.Equal(t, 1, countIn(t, tx))
		})
	}
}

// TestWriterSchemaCheckOnInsert: Validate always checks a payload against
// its JSON Schema; Insert and Queue do only when the Writer was built
// with WithSchemaCheckOnInsert, and otherwise write a payload of the wrong
// shape that passes every other check. The size limit (W6) and the checks
// that keep the INSERT from failing hold either way.
func TestWriterSchemaCheckOnInsert(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := context.Background()
	checking, err := outbox.NewWriter(outboxtest.Types(), outbox.WithSchemaCheckOnInsert())
	require.NoError(t, err)
	wrongShape := withPayload(`{"n": "not a number"}`)
	for _, tc := range []struct {
		name    string
		w       *outbox.Writer
		queue   bool
		refused bool
	}{
		{"InsertTrusts", testWriter, false, false},
		{"QueueTrusts", testWriter, true, false},
		{"InsertChecks", checking, false, true},
		{"QueueChecks", checking, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx) //nolint:errcheck // the test never commits
			events := []outbox.Event{event("agg-"+tc.name, 1, wrongShape)}
			require.ErrorIs(t, tc.w.Validate(events), outbox.ErrInvalidEvent, "Validate always checks the schema")
			if tc.queue {
				b := &pgx.Batch{}
				var inserted func(context.Context, pgx.Tx) error
				inserted, err = tc.w.Queue(ctx, b, events)
				if err == nil {
					require.NoError(t, tx.SendBatch(ctx, b).Close())
					err = inserted(ctx, tx)
				}
			} else {
				err = tc.w.Insert(ctx, tx, events)
			}
			if tc.refused {
				require.ErrorIs(t, err, outbox.ErrInvalidEvent)
				require.Zero(t, countIn(t, tx))
				return
			}
			require.NoError(t, err)
			require.Equal(t, 1, countIn(t, tx))

			for name, mod := range map[string]func(*outbox.Event){
				"TooLarge":  withPayload(`{"n": 1, "blob": "` + strings.Repeat("x", outbox.MaxPayloadBytes) + `"}`),
				"NotJSON":   withPayload(`{"n": 1`),
				"NULEscape": withPayload(`{"n": 1, "blob": "a\u0000b"}`),
			} {
				require.ErrorIs(t, tc.w.Insert(ctx, tx, []outbox.Event{event("agg-"+tc.name+name, 1, mod)}), outbox.ErrInvalidEvent, name)
			}
		})
	}
}

// countIn counts the outbox rows tx sees: its own uncommitted ones and
// committed ones (the test above never commits).
func countIn(t *testing.T, tx pgx.Tx) int {
	t.Helper()
	var n int
	require.NoError(t, tx.QueryRow(context.Background(), "SELECT count(*) FROM outbox").Scan(&n))
	return n
}

func withID(id uuid.UUID) func(*outbox.Event) {
	return func(e *outbox.Event) { e.ID = id }
}

// TestWriterInsert: valid events of one command are written in one call,
// with consecutive versions, generated IDs and the traceparent when there
// is one; a version written twice fails on the unique constraint, which
// aborts the caller's transaction.
func TestWriterInsert(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := context.Background()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	fixed := uuid.New()
	evs := []outbox.Event{
		event("agg", 1, withID(fixed), func(e *outbox.Event) { e.Traceparent = tp }),
		event("agg", 2, loose),
		event("other", 7),
		event("agg", 3),
	}
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, testWriter.Insert(ctx, tx, evs))
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, fixed, evs[0].ID, "a given ID is kept")
	for _, ev := range evs {
		require.NotEqual(t, uuid.Nil, ev.ID, "missing IDs are filled in")
		var version int64
		var traceparent *string
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT aggregate_version, traceparent FROM outbox WHERE event_id = $1", ev.ID).Scan(&version, &traceparent))
		require.Equal(t, ev.AggregateVersion, version)
		if ev.Traceparent == "" {
			require.Nil(t, traceparent)
		} else {
			require.Equal(t, tp, *traceparent)
		}
	}
	require.NoError(t, testWriter.Insert(ctx, nil, nil), "nothing to write is not an error")

	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // aborted on purpose
	err = testWriter.Insert(ctx, tx, []outbox.Event{event("agg", 3)})
	require.Error(t, err, "version 3 of agg exists")
	require.NotErrorIs(t, err, outbox.ErrInvalidEvent, "a database refusal is not a validation error")
	_, err = tx.Exec(ctx, "SELECT 1")
	require.Error(t, err, "a failed statement aborts the transaction; the caller rolls back")
}

// TestWriterQueue: Queue writes what Insert writes, as one statement of the
// caller's batch, and refuses the same events before anything is queued.
func TestWriterQueue(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := context.Background()
	evs := []outbox.Event{event("queued", 1), event("queued", 2, loose)}
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	b := &pgx.Batch{}
	b.Queue("SELECT 1") // the caller's own statement, sent in the same round trip
	inserted, err := testWriter.Queue(ctx, b, evs)
	require.NoError(t, err)
	require.Equal(t, 2, b.Len())
	require.NoError(t, tx.SendBatch(ctx, b).Close())
	require.NoError(t, inserted(ctx, tx))
	require.NoError(t, tx.Commit(ctx))
	for _, ev := range evs {
		var state string
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT state FROM outbox WHERE event_id = $1", ev.ID).Scan(&state))
		require.Equal(t, "pending", state)
	}

	b = &pgx.Batch{}
	_, err = testWriter.Queue(ctx, b, []outbox.Event{event("", 1)})
	require.ErrorIs(t, err, outbox.ErrInvalidEvent)
	require.Zero(t, b.Len(), "a refused event is never queued")

	b = &pgx.Batch{}
	inserted, err = testWriter.Queue(ctx, b, []outbox.Event{event("queued", 3)})
	require.NoError(t, err)
	require.Error(t, inserted(ctx, nil), "a batch that never ran is not taken for a write")
}

// TestWriterQueueOneTrip: a batch sent outside any explicit transaction,
// with the events queued by QueueOneTrip, commits the caller's rows and the
// events together in one round trip, and rolls back whole when any of its
// statements fails: one that follows the insert, or the insert itself,
// refusing an event type in direct or shadow publish mode, which
// NeedsTransaction then recognises.
func TestWriterQueueOneTrip(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, "CREATE TABLE business (id integer NOT NULL)")
	require.NoError(t, err)
	count := func(sql string) (n int) {
		require.NoError(t, db.Pool.QueryRow(ctx, sql).Scan(&n))
		return n
	}

	evs := []outbox.Event{event("one-trip", 1), event("one-trip", 2, loose)}
	b := &pgx.Batch{}
	b.Queue("INSERT INTO business VALUES (1)")
	require.NoError(t, testWriter.QueueOneTrip(ctx, b, evs))
	require.NoError(t, db.Pool.SendBatch(ctx, b).Close())
	require.Equal(t, 1, count("SELECT count(*) FROM business"))
	for _, ev := range evs {
		var state, mode string
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT state, publish_mode FROM outbox WHERE event_id = $1", ev.ID).Scan(&state, &mode))
		require.Equal(t, []string{"pending", "outbox"}, []string{state, mode})
	}

	// A statement after the insert fails: the rows before it roll back.
	b = &pgx.Batch{}
	b.Queue("INSERT INTO business VALUES (2)")
	require.NoError(t, testWriter.QueueOneTrip(ctx, b, []outbox.Event{event("one-trip", 3)}))
	b.Queue("INSERT INTO business VALUES (NULL)")
	err = db.Pool.SendBatch(ctx, b).Close()
	require.Error(t, err)
	require.False(t, outbox.NeedsTransaction(err), "a failed statement is not the publish mode's refusal")
	require.Equal(t, 1, count("SELECT count(*) FROM business"), "the batch rolls back whole")
	require.Equal(t, 2, count("SELECT count(*) FROM outbox WHERE aggregate_id = 'one-trip'"))

	// In direct or shadow mode the insert refuses the batch, which rolls
	// back whole; Queue in an explicit transaction then writes the event.
	for _, mode := range []string{"direct", "shadow"} {
		_, err = db.Pool.Exec(ctx, `INSERT INTO outbox_publish_mode (event_type, mode, changed_by) VALUES ($1, $2, 'test')
			ON CONFLICT (event_type) DO UPDATE SET mode = excluded.mode`, outboxtest.StrictType, mode)
		require.NoError(t, err)
		b = &pgx.Batch{}
		b.Queue("INSERT INTO business VALUES (3)")
		require.NoError(t, testWriter.QueueOneTrip(ctx, b, []outbox.Event{event("one-trip", 3)}))
		err = db.Pool.SendBatch(ctx, b).Close()
		require.True(t, outbox.NeedsTransaction(err), "%s mode: %v", mode, err)
		require.ErrorContains(t, err, "publish mode")
		require.Equal(t, 1, count("SELECT count(*) FROM business"), "%s mode: nothing commits", mode)
		require.Equal(t, 2, count("SELECT count(*) FROM outbox WHERE aggregate_id = 'one-trip'"))
	}
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	b = &pgx.Batch{}
	inserted, err := testWriter.Queue(ctx, b, []outbox.Event{event("one-trip", 3)})
	require.NoError(t, err)
	require.NoError(t, tx.SendBatch(ctx, b).Close(), "Queue writes the same event in an explicit transaction")
	require.ErrorIs(t, inserted(ctx, tx), outbox.ErrNoDirectPublisher, "and hands it to the direct path")
	require.NoError(t, tx.Rollback(ctx))

	require.False(t, outbox.NeedsTransaction(nil))
	require.NoError(t, testWriter.QueueOneTrip(ctx, b, nil), "nothing to write is not an error")
	b = &pgx.Batch{}
	require.ErrorIs(t, testWriter.QueueOneTrip(ctx, b, []outbox.Event{event("", 1)}), outbox.ErrInvalidEvent)
	require.Zero(t, b.Len(), "a refused event is never queued")
}

// TestNewWriterRefusesBadTypes: a list of event types that could never be
// written or delivered is refused at start-up.
func TestNewWriterRefusesBadTypes(t *testing.T) {
	t.Parallel()
	schemas := map[int][]byte{1: testSchema}
	for name, tc := range map[string]struct {
		types []outbox.EventType
		want  string
	}{
		"None":              {nil, "no event types"},
		"EmptyName":         {[]outbox.EventType{{Schemas: schemas}}, "empty name"},
		"ControlCharInName": {[]outbox.EventType{{Name: "a\tb", Schemas: schemas}}, "not printable"},
		"Twice":             {[]outbox.EventType{{Name: "a", Schemas: schemas}, {Name: "a", Schemas: schemas}}, "listed twice"},
		"NoSchema":          {[]outbox.EventType{{Name: "a"}}, "no JSON Schema"},
		"SchemaVersionZero": {[]outbox.EventType{{Name: "a", Schemas: map[int][]byte{0: testSchema}}}, "schema version 0"},
		"SchemaDoesNotCompile": {[]outbox.EventType{{Name: "a", Schemas: map[int][]byte{1: []byte(`{"type": 12}`)}}},
			"compile JSON Schema"},
		"UnknownOrdering": {[]outbox.EventType{{Name: "a", Ordering: outbox.Ordering(7), Schemas: schemas}}, "ordering"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := outbox.NewWriter(tc.types)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestWriterValidate: Validate applies Insert's checks without a database,
// for tools that write rows another way (O4 repairs).
func TestWriterValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, testWriter.Validate([]outbox.Event{event("a", 1), event("a", 2), event("b", 5)}))
	err := testWriter.Validate([]outbox.Event{event("a", 1, withPayload(`{"n": 1.5}`))})
	var ie *outbox.InvalidEventError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "Payload", ie.Field)
	require.Contains(t, ie.Reason, "/n (type)", "the reason names the failing location and keyword")
	require.Equal(t, fmt.Sprintf("outbox: invalid event 0 (%s): Payload %s", strictType, ie.Reason), err.Error())
	require.True(t, errors.Is(err, outbox.ErrInvalidEvent))
	require.NoError(t, testWriter.Validate(nil))
}

// TestOrderingsMatchTheCompiledOnes: the Writer and the relay describe
// orderings to package eventtypes as ints, so outbox.Strict and
// outbox.Independent must keep the values it tests for; otherwise an
// independent type would be claimed as strict, or refused.
func TestOrderingsMatchTheCompiledOnes(t *testing.T) {
	t.Parallel()
	require.Equal(t, eventtypes.Strict, int(outbox.Strict))
	require.Equal(t, eventtypes.Independent, int(outbox.Independent))
}
