package operate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/operate"
)

func TestErrorPattern(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`event 0b5e7f3a-6c1d-4e2f-9a8b-7c6d5e4f3a2b: unknown schema version 7`, `event <id>: unknown schema version <n>`},
		{`produce: MESSAGE_TOO_LARGE (1048576 > 1000012 bytes)`, `produce: MESSAGE_TOO_LARGE (<n> > <n> bytes)`},
		{`field "email" is "a@b.c"; was 'x'`, `field <v> is <v>; was <v>`},
		{`digest deadbeefdeadbeefdeadbeef, addr 0x1f`, `digest <hex>, addr <hex>`},
	} {
		require.Equal(t, tc.want, operate.ErrorPattern(tc.in), tc.in)
	}
	a, _ := operate.Fingerprint("t", "c", "order 1 failed")
	b, _ := operate.Fingerprint("t", "c", "order 2 failed")
	other, _ := operate.Fingerprint("t", "d", "order 1 failed")
	require.Equal(t, a, b, "numbers do not split a group")
	require.NotEqual(t, a, other, "the error class does")
	require.True(t, operate.ValidFingerprint(a))
	require.False(t, operate.ValidFingerprint("../etc/passwd0000"))
	require.False(t, operate.ValidFingerprint("ABCDEF0123456789"), "only the lower-case form names a group")
}

// park sets events parked with an error, as the relay would.
func (e *env) park(t *testing.T, class, text string, events ...outbox.Event) {
	t.Helper()
	for _, ev := range events {
		_, err := e.DB.Pool.Exec(context.Background(),
			`UPDATE outbox SET state = 'parked', attempts = 3, last_error_class = $2, last_error = $3 WHERE event_id = $1`,
			ev.ID, class, text)
		require.NoError(t, err)
	}
}

// TestFailureGroups parks events of three failures and checks the groups
// against the table: counts, patterns, and that a group's events are all
// its events, more than one page of them.
func TestFailureGroups(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	admin := e.admin()

	var schemaFail, tooLarge, looseFail []outbox.Event
	for i := range 150 {
		schemaFail = append(schemaFail, e.Insert(t, event(fmt.Sprintf("agg-%d", i), 1))...)
	}
	for i := range 4 {
		tooLarge = append(tooLarge, e.Insert(t, event(fmt.Sprintf("big-%d", i), 1))...)
	}
	for i := range 3 {
		looseFail = append(looseFail, e.Insert(t, event(fmt.Sprintf("loose-%d", i), 1, loose))...)
	}
	for i, ev := range schemaFail {
		e.park(t, "unknown_schema_version", fmt.Sprintf("event %s: schema version %d is not registered", ev.ID, i%5+2), ev)
	}
	for i, ev := range tooLarge {
		e.park(t, "too_large", fmt.Sprintf("record of %d bytes", 2_000_000+i), ev)
	}
	for _, ev := range looseFail {
		e.park(t, "unknown_schema_version", fmt.Sprintf("event %s: schema version 9 is not registered", ev.ID), ev)
	}
	e.Insert(t, event("healthy", 1)) // pending: in no group

	groups, err := admin.FailureGroups(ctx)
	require.NoError(t, err)
	require.Len(t, groups, 3)
	require.Equal(t, 150, groups[0].Count, "largest first")
	require.Equal(t, strictType, groups[0].EventType)
	require.Equal(t, "event <id>: schema version <n> is not registered", groups[0].Pattern)
	total := 0
	for _, g := range groups {
		total += g.Count
	}
	require.Equal(t, e.Count(t, "state = 'parked'"), total, "every parked event is in exactly one group")

	g, ids, err := admin.FailureGroupEvents(ctx, groups[0].Fingerprint)
	require.NoError(t, err)
	require.Equal(t, groups[0], g)
	require.ElementsMatch(t, eventIDs(schemaFail), ids)

	_, _, err = admin.FailureGroupEvents(ctx, "0000000000000000")
	require.ErrorIs(t, err, operate.ErrNotFound)
}

func eventIDs(events []outbox.Event) []uuid.UUID {
	out := make([]uuid.UUID, len(events))
	for i, ev := range events {
		out[i] = ev.ID
	}
	return out
}

// TestResumeGroup resumes a whole group in batches: every event of the
// group and no other, one audit entry per event naming the actor, and an
// event that left the group meanwhile (resumed by someone else, or parked
// again by another failure) skipped under lock.
func TestResumeGroup(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	admin := e.admin()

	var group, other []outbox.Event
	for i := range 25 {
		group = append(group, e.Insert(t, event(fmt.Sprintf("agg-%d", i), 1))...)
	}
	for i := range 3 {
		other = append(other, e.Insert(t, event(fmt.Sprintf("other-%d", i), 1))...)
	}
	for i, ev := range group {
		e.park(t, "broker", fmt.Sprintf("partition %d unavailable", i%6), ev)
	}
	e.park(t, "too_large", "record of 2000000 bytes", other...)
	groups, err := admin.FailureGroups(ctx)
	require.NoError(t, err)
	fp := groups[0].Fingerprint
	require.Equal(t, 25, groups[0].Count)

	// Between the snapshot and the batches: one event is resumed by hand,
	// one parked again with another failure. A test hook would be more
	// exact; a first batch of one event gives the same window.
	var calls []operate.BulkProgress
	first := true
	p, err := admin.ResumeGroup(ctx, fp, ops, 7, func(bp operate.BulkProgress) {
		calls = append(calls, bp)
		if first {
			first = false
			_, err := admin.Resume(ctx, []uuid.UUID{group[24].ID}, "", operate.Actor{Subject: "someone", Reason: "by hand"})
			require.NoError(t, err)
			e.park(t, "schema", "another failure", group[23])
		}
	})
	require.NoError(t, err)
	require.Equal(t, operate.BulkProgress{Total: 25, Done: 23, Skipped: 2}, p)
	require.Len(t, calls, 4, "25 events in batches of 7")
	require.Equal(t, 7, calls[0].Done)

	for _, ev := range group[:23] {
		require.Equal(t, "pending", e.Row(t, ev.ID).State)
	}
	require.Equal(t, "parked", e.Row(t, group[23].ID).State, "it left the group: not resumed")
	for _, ev := range other {
		require.Equal(t, "parked", e.Row(t, ev.ID).State, "another group is untouched")
	}
	entries, err := admin.AuditLog(ctx, operate.AuditFilter{Actor: ops.Subject})
	require.NoError(t, err)
	require.Len(t, entries, 23, "one audit entry per event resumed")
	for _, en := range entries {
		require.Equal(t, "resume", en.Action)
		require.Equal(t, ops.Reason, en.Reason)
		require.NotEmpty(t, en.BeforeSHA256)
	}
	byTarget, err := admin.AuditLog(ctx, operate.AuditFilter{Target: group[24].ID.String()})
	require.NoError(t, err)
	require.Len(t, byTarget, 1)
	require.Equal(t, "someone", byTarget[0].Actor)
	future, err := admin.AuditLog(ctx, operate.AuditFilter{From: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.Empty(t, future)

	_, err = admin.ResumeGroup(ctx, fp, operate.Actor{Subject: "ops"}, 0, nil)
	require.ErrorIs(t, err, operate.ErrActorRequired)
}

// TestRepairGroup sets the schema version of a whole group through Repair's
// checks: events the new version's schema refuses are counted and left.
func TestRepairGroup(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	admin := e.admin()

	good := e.InsertRaw(t, event("a", 1, func(ev *outbox.Event) { ev.SchemaVersion = 2 }), event("b", 1, func(ev *outbox.Event) { ev.SchemaVersion = 2 }))
	bad := e.InsertRaw(t, event("c", 1, func(ev *outbox.Event) { ev.SchemaVersion = 2; ev.Payload = []byte(`{"m": 1}`) }))
	all := append(append([]outbox.Event{}, good...), bad...)
	e.park(t, "unknown_schema_version", "schema version 2 is not registered", all...)
	groups, err := admin.FailureGroups(ctx)
	require.NoError(t, err)
	require.Len(t, groups, 1)

	p, err := admin.RepairGroup(ctx, groups[0].Fingerprint, 1, ops, nil)
	require.NoError(t, err)
	require.Equal(t, 3, p.Total)
	require.Equal(t, 2, p.Done)
	require.Equal(t, 1, p.Failed, "v1 requires n")
	require.NotEmpty(t, p.FirstError)
	for _, ev := range all {
		require.Equal(t, "parked", e.Row(t, ev.ID).State, "a repair keeps the event parked")
	}
	d, err := admin.Event(ctx, good[0].ID)
	require.NoError(t, err)
	require.Equal(t, 1, d.SchemaVersion)
	d, err = admin.Event(ctx, bad[0].ID)
	require.NoError(t, err)
	require.Equal(t, 2, d.SchemaVersion, "refused: unchanged")
}
