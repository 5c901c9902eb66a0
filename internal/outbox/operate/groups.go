package operate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/orders/internal/outbox/internal/pgtx"
	"github.com/outboxref/orders/internal/outbox/operate/internal/opsdb"
)

// Failure groups: parked events put together by what failed, so that an
// operator fixes a cause once instead of an event at a time. Two events
// are in one group when their event type, error class and error text match
// once the parts that differ from event to event (ids, numbers, quoted
// values) are taken out of the text.

// FailureGroup is the parked events of one fingerprint.
type FailureGroup struct {
	// Fingerprint names the group: 16 hex digits of a hash of the event
	// type, the error class and Pattern. It is stable across processes
	// and releases as long as Pattern is.
	Fingerprint string    `json:"fingerprint"`
	EventType   string    `json:"event_type"`
	ErrorClass  string    `json:"error_class"`
	Pattern     string    `json:"pattern"`
	Count       int       `json:"count"`
	Oldest      time.Time `json:"oldest"`
	Newest      time.Time `json:"newest"`
	// Sample is one event of the group, to open its detail.
	Sample uuid.UUID `json:"sample"`
}

var (
	uuidRE   = regexp.MustCompile(`(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`)
	quotedRE = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	hexRE    = regexp.MustCompile(`(?i)\b0x[0-9a-f]+\b|\b[0-9a-f]{16,}\b`)
	numberRE = regexp.MustCompile(`\d+(?:\.\d+)?`)
)

// ErrorPattern is an error text with what varies from event to event
// replaced: UUIDs by <id>, quoted values by <v>, long hex strings by <hex>
// and numbers by <n>.
func ErrorPattern(text string) string {
	text = uuidRE.ReplaceAllString(text, "<id>")
	text = quotedRE.ReplaceAllString(text, "<v>")
	text = hexRE.ReplaceAllString(text, "<hex>")
	return numberRE.ReplaceAllString(text, "<n>")
}

// Fingerprint returns the failure group of a parked event and the pattern
// of its error text.
func Fingerprint(eventType, errorClass, errorText string) (fingerprint, pattern string) {
	pattern = ErrorPattern(errorText)
	h := sha256.New()
	for _, s := range []string{eventType, errorClass, pattern} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:8]), pattern
}

// ValidFingerprint reports whether s has a fingerprint's form (16 lower
// case hex digits), so a caller can refuse anything else before a query.
func ValidFingerprint(s string) bool {
	if len(s) != 16 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && s == toLowerHex(s)
}

func toLowerHex(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'F' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// parkedGroups reads every parked event and groups it. The list is read
// in one query; the grouping is Go's, so that the rule is written once,
// here, for the list, a group's events and the bulk actions.
func (a *Admin) parkedGroups(ctx context.Context) ([]FailureGroup, map[string][]uuid.UUID, error) {
	rows, err := opsdb.New(a.pool).GroupParkedRows(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("read parked events: %w", err)
	}
	byFP := map[string]*FailureGroup{}
	ids := map[string][]uuid.UUID{}
	var order []string
	for _, r := range rows {
		class := deref(r.LastErrorClass)
		fp, pattern := Fingerprint(r.EventType, class, deref(r.LastError))
		g, ok := byFP[fp]
		if !ok {
			g = &FailureGroup{Fingerprint: fp, EventType: r.EventType, ErrorClass: class, Pattern: pattern,
				Oldest: r.CreatedAt, Sample: r.EventID}
			byFP[fp] = g
			order = append(order, fp)
		}
		g.Count++
		g.Newest = r.CreatedAt // rows come oldest first
		ids[fp] = append(ids[fp], r.EventID)
	}
	out := make([]FailureGroup, 0, len(order))
	for _, fp := range order {
		out = append(out, *byFP[fp])
	}
	// The largest group first: that is where a fix helps most.
	slices.SortStableFunc(out, func(x, y FailureGroup) int { return y.Count - x.Count })
	return out, ids, nil
}

// FailureGroups lists the groups of parked events, largest first. It reads
// every parked row (not delivered ones): a report for an operator.
func (a *Admin) FailureGroups(ctx context.Context) ([]FailureGroup, error) {
	groups, _, err := a.parkedGroups(ctx)
	return groups, err
}

// FailureGroupEvents returns one group and the ids of all its events,
// oldest first; ErrNotFound when no parked event has that fingerprint.
func (a *Admin) FailureGroupEvents(ctx context.Context, fingerprint string) (FailureGroup, []uuid.UUID, error) {
	groups, ids, err := a.parkedGroups(ctx)
	if err != nil {
		return FailureGroup{}, nil, err
	}
	for _, g := range groups {
		if g.Fingerprint == fingerprint {
			return g, ids[fingerprint], nil
		}
	}
	return FailureGroup{}, nil, fmt.Errorf("failure group %s: %w", fingerprint, ErrNotFound)
}

// BulkProgress is how far a bulk action over a failure group is.
type BulkProgress struct {
	// Total is the number of events the group had when the action started.
	Total int `json:"total"`
	// Done counts the events changed; Skipped those no longer parked in
	// the group when their batch came (resumed or repaired by someone
	// else meanwhile); Failed those refused (a repair that fails a check).
	Done    int `json:"done"`
	Skipped int `json:"skipped"`
	Failed  int `json:"failed"`
	// FirstError is the first refusal's reason, for the operator.
	FirstError string `json:"first_error,omitempty"`
}

// defaultBulkBatch is how many events one transaction of a bulk action
// changes: small enough to hold few locks for a short time.
const defaultBulkBatch = 200

// ResumeGroup resumes every event of a failure group, the whole group and
// not one page of it, in transactions of batch events (200 when zero).
// Each event is re-checked in its batch, under lock: still parked and
// still of this fingerprint, or it is skipped. Each resumed event gets its
// own audit entry naming the actor, as Resume writes. progress is called
// after each batch; ctx ending stops between two batches, with what is
// done kept.
func (a *Admin) ResumeGroup(ctx context.Context, fingerprint string, actor Actor, batch int, progress func(BulkProgress)) (BulkProgress, error) {
	if err := actor.check(); err != nil {
		return BulkProgress{}, err
	}
	_, ids, err := a.FailureGroupEvents(ctx, fingerprint)
	if err != nil {
		return BulkProgress{}, err
	}
	if batch <= 0 {
		batch = defaultBulkBatch
	}
	p := BulkProgress{Total: len(ids)}
	for chunk := range slices.Chunk(ids, batch) {
		if err := ctx.Err(); err != nil {
			return p, err
		}
		n, err := a.resumeBatch(ctx, fingerprint, chunk, actor)
		if err != nil {
			return p, err
		}
		p.Done += n
		p.Skipped += len(chunk) - n
		if progress != nil {
			progress(p)
		}
	}
	return p, nil
}

func (a *Admin) resumeBatch(ctx context.Context, fingerprint string, ids []uuid.UUID, actor Actor) (int, error) {
	resumed := 0
	err := pgtx.Run(ctx, a.pool, func(tx pgx.Tx) error {
		q := opsdb.New(tx)
		locked, err := q.GroupParkedLock(ctx, ids)
		if err != nil {
			return fmt.Errorf("lock parked events: %w", err)
		}
		before := map[uuid.UUID]opsdb.Outbox{}
		keep := make([]uuid.UUID, 0, len(locked))
		for _, r := range locked {
			if fp, _ := Fingerprint(r.EventType, deref(r.LastErrorClass), deref(r.LastError)); fp == fingerprint {
				before[r.EventID] = r
				keep = append(keep, r.EventID)
			}
		}
		if len(keep) == 0 {
			return nil
		}
		after, err := q.AdminResume(ctx, opsdb.AdminResumeParams{EventIDs: keep})
		if err != nil {
			return fmt.Errorf("resume events: %w", err)
		}
		for _, r := range after {
			b := before[r.EventID]
			detail, _ := json.Marshal(map[string]any{"previous_error_class": deref(b.LastErrorClass), "attempts": b.Attempts,
				"failure_group": fingerprint})
			if err := writeAudit(ctx, q, actor, "resume", r.EventID.String(), rowHash(b), rowHash(r), detail); err != nil {
				return err
			}
		}
		resumed = len(after)
		return nil
	})
	return resumed, err
}

// RepairGroup sets the schema version of every event of a failure group,
// the whole group, one event per transaction through Repair: the same
// checks (the writer's schema, the service's own), the same audit entry
// per event. An event refused by a check is counted in Failed and left as
// it was; the others go on. Repaired events stay parked, now in the
// "repaired" group, for ResumeGroup or Resume to send.
func (a *Admin) RepairGroup(ctx context.Context, fingerprint string, schemaVersion int, actor Actor, progress func(BulkProgress)) (BulkProgress, error) {
	if err := actor.check(); err != nil {
		return BulkProgress{}, err
	}
	if schemaVersion <= 0 {
		return BulkProgress{}, ErrNothingToChange
	}
	_, ids, err := a.FailureGroupEvents(ctx, fingerprint)
	if err != nil {
		return BulkProgress{}, err
	}
	p := BulkProgress{Total: len(ids)}
	for i, id := range ids {
		if err := ctx.Err(); err != nil {
			return p, err
		}
		_, err := a.Repair(ctx, id, Repair{SchemaVersion: schemaVersion}, actor)
		switch {
		case err == nil:
			p.Done++
		case errors.Is(err, ErrNotParked), errors.Is(err, ErrNotFound):
			p.Skipped++
		case errors.Is(err, ErrRepairRefused):
			p.Failed++
			if p.FirstError == "" {
				p.FirstError = err.Error()
			}
		default:
			return p, err
		}
		if progress != nil && ((i+1)%defaultBulkBatch == 0 || i+1 == len(ids)) {
			progress(p)
		}
	}
	return p, nil
}

// AuditFilter narrows AuditLog. Zero fields match everything.
type AuditFilter struct {
	Actor  string
	Target string
	From   time.Time // inclusive
	To     time.Time // exclusive
	// Limit bounds the list; 200 when zero.
	Limit int
}

// AuditLog lists operators' writes, newest first.
func (a *Admin) AuditLog(ctx context.Context, f AuditFilter) ([]AuditEntry, error) {
	p := opsdb.AuditListParams{RowLimit: int32(f.Limit)}
	if p.RowLimit <= 0 {
		p.RowLimit = 200
	}
	p.Actor, p.Target, p.FromAt, p.ToAt = orNil(f.Actor), orNil(f.Target), timeOrNil(f.From), timeOrNil(f.To)
	rows, err := opsdb.New(a.pool).AuditList(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("read audit: %w", err)
	}
	out := make([]AuditEntry, len(rows))
	for i, r := range rows {
		out[i] = auditEntry(r)
	}
	return out, nil
}

func auditEntry(r opsdb.OutboxAudit) AuditEntry {
	e := AuditEntry{At: r.At, Actor: r.Actor, Action: r.Action, Target: r.Target, Reason: r.Reason, Detail: r.Detail}
	if len(r.BeforeSha256) > 0 {
		e.BeforeSHA256 = hex.EncodeToString(r.BeforeSha256)
	}
	if len(r.AfterSha256) > 0 {
		e.AfterSHA256 = hex.EncodeToString(r.AfterSha256)
	}
	return e
}

// EventsByTrace lists the events written inside one trace (at most 100),
// found by the trace id of their traceparent. traceID must be 32 hex
// digits.
func (a *Admin) EventsByTrace(ctx context.Context, traceID string) ([]EventSummary, error) {
	if len(traceID) != 32 {
		return nil, fmt.Errorf("trace id %q: %w", traceID, ErrNotFound)
	}
	if _, err := hex.DecodeString(traceID); err != nil {
		return nil, fmt.Errorf("trace id: %w", ErrNotFound)
	}
	rows, err := opsdb.New(a.pool).EventsByTrace(ctx, toLowerHex(traceID))
	if err != nil {
		return nil, fmt.Errorf("events of trace %s: %w", traceID, err)
	}
	out := make([]EventSummary, len(rows))
	for i, r := range rows {
		out[i] = EventSummary{EventID: r.EventID, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
			AggregateVersion: r.AggregateVersion, EventType: r.EventType, SchemaVersion: int(r.SchemaVersion),
			CreatedAt: r.CreatedAt, Attempts: int(r.Attempts), ErrorClass: deref(r.LastErrorClass), LastError: deref(r.LastError)}
	}
	return out, nil
}

// AggregateEvent is one event of an aggregate's history, with its state.
type AggregateEvent struct {
	EventSummary
	State string `json:"state"`
}

// EventsOfAggregate lists the events of one aggregate still in the
// outbox, in version order, with their delivery state.
func (a *Admin) EventsOfAggregate(ctx context.Context, aggregateType, aggregateID string) ([]AggregateEvent, error) {
	rows, err := opsdb.New(a.pool).EventsByAggregate(ctx, opsdb.EventsByAggregateParams{AggregateType: aggregateType, AggregateID: aggregateID})
	if err != nil {
		return nil, fmt.Errorf("events of %s %s: %w", aggregateType, aggregateID, err)
	}
	out := make([]AggregateEvent, len(rows))
	for i, r := range rows {
		out[i] = AggregateEvent{State: r.State, EventSummary: EventSummary{EventID: r.EventID, AggregateType: r.AggregateType,
			AggregateID: r.AggregateID, AggregateVersion: r.AggregateVersion, EventType: r.EventType, SchemaVersion: int(r.SchemaVersion),
			CreatedAt: r.CreatedAt, Attempts: int(r.Attempts), ErrorClass: deref(r.LastErrorClass), LastError: deref(r.LastError)}}
	}
	return out, nil
}

// RelayLease is a live relay: its owner name, how many partitions of the
// aggregates it owns now, and when its heartbeat lapses unless renewed
// (it is renewed about every second, so this is its last sign of life
// plus the lease).
type RelayLease struct {
	Owner      string    `json:"owner"`
	Partitions int64     `json:"partitions"`
	ExpiresAt  time.Time `json:"expires_at"`
}

// RelayLeases lists the relays alive now, from their heartbeats. An empty
// list with a backlog means no relay is running.
func (a *Admin) RelayLeases(ctx context.Context) ([]RelayLease, error) {
	rows, err := opsdb.New(a.pool).RelayActivity(ctx)
	if err != nil {
		return nil, fmt.Errorf("read relay heartbeats: %w", err)
	}
	out := make([]RelayLease, len(rows))
	for i, r := range rows {
		out[i] = RelayLease{Owner: r.Owner, Partitions: r.Partitions, ExpiresAt: r.ExpiresAt}
	}
	return out, nil
}

// StartReplay starts a plan's run in the background, as POST
// /replays/{id}/run does, and returns once the plan is marked running (or
// refused: ErrNeedsApproval, ErrApprovalExpired, ErrPlanState). The run
// follows background; WaitReplays waits for it.
func (a *Admin) StartReplay(ctx, background context.Context, id uuid.UUID, target ReplayTarget, policy ReplayPolicy, actor Actor, log *slog.Logger) error {
	if err := actor.check(); err != nil {
		return err
	}
	owner, err := a.startRun(ctx, id, policy, actor, false)
	if err != nil {
		return err
	}
	if log == nil {
		log = slog.Default()
	}
	a.runInBackground(background, id, owner, target, policy, log.With("actor", actor.Subject))
	return nil
}
