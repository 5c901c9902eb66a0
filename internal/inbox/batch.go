package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/orders/internal/inbox/internal/inboxdb"
)

// BatchApplyFunc performs the changes of several events inside tx, as
// ApplyFunc does for one. The events are in the order they must take
// effect: several may belong to one aggregate, in consecutive versions. It
// exists so that a consumer can write a batch's changes with a few
// set-based statements instead of a few statements per event. An error
// rolls back the whole transaction; an *EventError names the event (its
// index in events) that caused it.
type BatchApplyFunc func(ctx context.Context, tx pgx.Tx, events []Event) error

// EventError is the failure of one event of a batch. Index is the event's
// position in the slice given to ProcessBatch (or, returned by a
// BatchApplyFunc, in the slice it was given).
type EventError struct {
	Index int
	Err   error
}

func (e *EventError) Error() string { return fmt.Sprintf("event %d of the batch: %v", e.Index, e.Err) }
func (e *EventError) Unwrap() error { return e.Err }

// errMarkerTaken means an event_id that was unknown a moment earlier in the
// transaction got a marker meanwhile: another consumer, holding none of
// this batch's aggregate locks, recorded the same event_id for another
// aggregate. The batch fails; processed again, the event is a duplicate.
var errMarkerTaken = errors.New("inbox: a batch event's marker was written concurrently")

// ProcessBatch is Process for several events in the caller's transaction:
// the outcomes are exactly those of calling Process for each event in
// order. Call Observe with each result after tx commits.
//
// With Config.ApplyBatch set, the common case costs a handful of
// statements for the whole batch instead of several per event: every event
// that is simply the next version of an aggregate with nothing unusual
// about it (no open gap, nothing held or parked, no forked history, an
// event_id never seen) gets its marker, its change and its aggregate's new
// version in one set-based statement each. The first event of an
// aggregate that is not such an event, and every later event of that
// aggregate in the batch, goes through Process one by one after the
// set-based part, which keeps each aggregate's order (aggregates are
// independent of each other). A batch holding one event_id twice is
// processed one by one throughout, since which copy wins depends on order.
//
// The rest of tx, ApplyBatch's statements included, is planned for each
// execution rather than by a cached generic plan (see planEachBatch).
//
// On error nothing of the batch may be kept: the caller rolls tx back. The
// error is an *EventError when one event caused it; a caller that wants a
// single bad event not to hold back the others then processes the events
// one transaction each.
func (ib *Inbox) ProcessBatch(ctx context.Context, tx pgx.Tx, events []Event) ([]Result, error) {
	for i, e := range events {
		if err := e.validate(); err != nil {
			return nil, &EventError{Index: i, Err: err}
		}
	}
	if _, err := tx.Exec(ctx, planEachBatch); err != nil {
		return nil, fmt.Errorf("inbox: plan the batch's statements: %w", err)
	}
	results := make([]Result, len(events))
	slow := make([]int, 0, len(events))
	if ib.cfg.ApplyBatch == nil || len(events) < 2 || hasRepeatedID(events) {
		for i := range events {
			slow = append(slow, i)
		}
	} else {
		var err error
		if slow, err = ib.applySetBased(ctx, tx, events, results); err != nil {
			return nil, err
		}
	}
	for _, i := range slow {
		res, err := ib.Process(ctx, tx, events[i])
		if err != nil {
			return nil, &EventError{Index: i, Err: err}
		}
		results[i] = res
	}
	return results, nil
}

// planEachBatch has PostgreSQL plan the rest of the caller's transaction
// for the arrays it is given instead of reusing a generic plan. pgx
// prepares each statement once per connection, and after five executions
// PostgreSQL may settle on a generic plan made for the table as it was
// then. On a new database that is an empty table, and the plan (hash the
// batch's arrays and read the whole table, or a sequential scan for
// "= ANY") is kept until the table is next analysed, which autovacuum
// does not do before its first visit: until then every batch reads every
// aggregate and every projection, O(table) per batch. A plan made for each
// execution sees the table's current size and the arrays' lengths; it costs
// a few planning passes per batch, a batch being up to hundreds of events.
// The setting ends with the transaction.
const planEachBatch = "SELECT set_config('plan_cache_mode', 'force_custom_plan', true)"

type aggKey struct{ typ, id string }

// lockedAgg is what the batch's lock read about an aggregate.
type lockedAgg struct {
	last    int64
	unusual bool // a gap, a fork, held or parked events: Process decides
}

func keyOf(e Event) aggKey { return aggKey{e.AggregateType, e.AggregateID} }

func hasRepeatedID(events []Event) bool {
	seen := make(map[uuid.UUID]struct{}, len(events))
	for _, e := range events {
		if _, ok := seen[e.ID]; ok {
			return true
		}
		seen[e.ID] = struct{}{}
	}
	return false
}

// applySetBased applies, set-based, the events that are plainly the next
// version of their aggregate, fills in their results and returns the
// indexes of the others, in order, for Process.
func (ib *Inbox) applySetBased(ctx context.Context, tx pgx.Tx, events []Event, results []Result) (slow []int, err error) {
	q := inboxdb.New(tx)

	// Lock every aggregate of the batch, in key order: two consumers that
	// overlap briefly after a rebalance then wait for each other instead
	// of deadlocking.
	keys := make([]aggKey, 0, len(events))
	for _, e := range events {
		keys = append(keys, keyOf(e))
	}
	slices.SortFunc(keys, func(a, b aggKey) int { return cmp.Or(cmp.Compare(a.typ, b.typ), cmp.Compare(a.id, b.id)) })
	keys = slices.Compact(keys)
	types, ids := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		types[i], ids[i] = k.typ, k.id
	}
	if err := q.InboxAggregateEnsureMany(ctx, inboxdb.InboxAggregateEnsureManyParams{AggregateTypes: types, AggregateIDs: ids}); err != nil {
		return nil, fmt.Errorf("ensure inbox aggregates: %w", err)
	}
	rows, err := q.InboxAggregateLockMany(ctx, inboxdb.InboxAggregateLockManyParams{AggregateTypes: types, AggregateIDs: ids})
	if err != nil {
		return nil, fmt.Errorf("lock inbox aggregates: %w", err)
	}
	if len(rows) != len(keys) {
		return nil, fmt.Errorf("lock inbox aggregates: %d of %d found", len(rows), len(keys))
	}
	locked := make(map[aggKey]lockedAgg, len(rows))
	for _, r := range rows {
		locked[aggKey{r.AggregateType, r.AggregateID}] = lockedAgg{last: r.LastVersion, unusual: r.Unusual}
	}

	// The markers first, as in Process: they commit or roll back with the
	// changes. They are inserted for the events that look like plain next
	// versions without asking first whether their event_ids are known: in
	// the common case every insert is new, and the question would cost a
	// round trip per batch. An event_id already known (a producer reusing
	// one for another aggregate) makes its insert return no row; then this
	// transaction's new markers are deleted again, which leaves no trace,
	// and the batch is sorted once more with those event_ids known.
	known := map[uuid.UUID]bool{}
	var fast []Event
	var fastIdx []int
	var moved map[aggKey]int64
	for attempt := 0; ; attempt++ {
		fast, fastIdx, moved, slow = classify(events, locked, known)
		if len(fast) == 0 {
			return slow, nil
		}
		inserted, err := q.ProcessedEventInsertMany(ctx, markerParams(fast))
		if err != nil {
			return nil, fmt.Errorf("insert processed_event: %w", err)
		}
		if len(inserted) == len(fast) {
			break
		}
		if attempt > 0 {
			// Unknown a moment ago, taken now: another consumer, holding
			// none of these aggregates, recorded one of these event_ids.
			return nil, errMarkerTaken
		}
		fresh := make(map[uuid.UUID]bool, len(inserted))
		for _, id := range inserted {
			fresh[id] = true
		}
		for _, e := range fast {
			if !fresh[e.ID] {
				known[e.ID] = true
			}
		}
		if err := q.ProcessedEventDeleteMany(ctx, inserted); err != nil {
			return nil, fmt.Errorf("undo processed_event: %w", err)
		}
	}

	if err := ib.cfg.ApplyBatch(ctx, tx, fast); err != nil {
		if ee, ok := errors.AsType[*EventError](err); ok && ee.Index >= 0 && ee.Index < len(fastIdx) {
			e := fast[ee.Index]
			return nil, &EventError{Index: fastIdx[ee.Index], Err: fmt.Errorf("apply %s v%d: %w", e.Type, e.AggregateVersion, ee.Err)}
		}
		return nil, fmt.Errorf("apply batch: %w", err)
	}

	// Each aggregate moves to the last version the batch applied. As in
	// applyOne, the guarded update is an assertion: the rows are locked.
	var adv inboxdb.InboxAggregateAdvanceManyParams
	for _, k := range keys {
		if v, ok := moved[k]; ok {
			adv.AggregateTypes = append(adv.AggregateTypes, k.typ)
			adv.AggregateIDs = append(adv.AggregateIDs, k.id)
			adv.NewVersions = append(adv.NewVersions, v)
		}
	}
	n, err := q.InboxAggregateAdvanceMany(ctx, adv)
	if err != nil {
		return nil, fmt.Errorf("advance aggregate versions: %w", err)
	}
	if n != int64(len(adv.NewVersions)) {
		return nil, fmt.Errorf("advance %d aggregates: only %d moved forward", len(adv.NewVersions), n)
	}

	for j, e := range fast {
		results[fastIdx[j]] = Result{Outcome: Applied, Applied: []Event{e}, LastVersion: e.AggregateVersion, event: e}
	}
	return slow, nil
}

// classify splits a batch into the events the set-based path applies (in
// order, with their indexes, and the version each aggregate reaches) and
// the indexes of the others, for Process. An event takes the set-based
// path only while its aggregate's events so far did: the first one that
// needs a decision (a duplicate, a gap, a conflict, a known event_id)
// sends the rest of its aggregate to Process, after the set-based part, so
// each aggregate keeps its order.
func classify(events []Event, locked map[aggKey]lockedAgg, known map[uuid.UUID]bool) (fast []Event, fastIdx []int, moved map[aggKey]int64, slow []int) {
	moved = map[aggKey]int64{}
	blocked := map[aggKey]bool{}
	for i, e := range events {
		k := keyOf(e)
		a := locked[k]
		last, ok := moved[k]
		if !ok {
			last = a.last
		}
		if blocked[k] || a.unusual || known[e.ID] || e.AggregateVersion != last+1 {
			blocked[k] = true
			slow = append(slow, i)
			continue
		}
		moved[k] = e.AggregateVersion
		fast = append(fast, e)
		fastIdx = append(fastIdx, i)
	}
	return fast, fastIdx, moved, slow
}

func markerParams(events []Event) inboxdb.ProcessedEventInsertManyParams {
	n := len(events)
	p := inboxdb.ProcessedEventInsertManyParams{
		EventIDs: make([]uuid.UUID, n), AggregateTypes: make([]string, n), AggregateIDs: make([]string, n),
		AggregateVersions: make([]int64, n), EventTypes: make([]string, n),
	}
	for i, e := range events {
		p.EventIDs[i], p.AggregateTypes[i], p.AggregateIDs[i] = e.ID, e.AggregateType, e.AggregateID
		p.AggregateVersions[i], p.EventTypes[i] = e.AggregateVersion, e.Type
	}
	return p
}
