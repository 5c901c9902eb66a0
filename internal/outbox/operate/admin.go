// Package operate holds the outbox's operations, the tools of an on-call
// engineer: what is stuck and why, and how to move it again without losing
// an event or sending one twice by accident.
//
// Each write is audited with its actor and reason, in the same
// transaction as the change (O4-O6), and re-checks what it changes: a
// repaired payload passes the Writer's checks and the service's own
// (WithRepairCheck) before the row is released, a replay needs a plan, and
// a large one a second admin's approval, before anything is published, and
// the retention cleanup keeps the identity of every event it deletes.
//
// Its API:
//   - NewAdmin, Admin, Actor, AdminOption, WithRepairCheck: the operations
//     over one outbox and its Writer.
//   - Admin.Stats, Admin.Parked, Admin.Event (Stat, ParkedFilter,
//     EventSummary, EventDetail, AuditEntry, ReplayRecord): what is there.
//   - Admin.Repair (Repair), Admin.Resume: release parked events (O4;
//     ErrNotFound, ErrNotParked, ErrNothingToChange, ErrRepairRefused).
//   - Admin.PlanReplay, ReplayPlan, ApproveReplay, RunReplay with
//     ReplaySelector, ReplayPolicy, Consumer, ConsumerImpact, SkippedEvent
//     and ReplayTarget; ResumeReplays and WaitReplays, which continue
//     replays whose process stopped and let a stopping one record where it
//     was (O5; ErrNeedsApproval, ErrApprovalExpired, ErrSameApprover,
//     ErrPlanState, ErrTooManyEvents, ErrBadSelector).
//   - Admin.Cleanup (Cleanup), Admin.RunCleanup, Admin.Collector: the
//     retention, into outbox_archive (O6): one run, or the loop a service
//     starts once to run it every interval, with its metrics.
//   - PublishMode (ModeDirect, ModeShadow, ModeOutbox), ParsePublishMode,
//     ErrInvalidPublishMode, Admin.PublishModes, Admin.SetPublishMode,
//     Admin.ShadowReport and ModeSetting, ShadowReport, ShadowCount,
//     ShadowDiff: migrating from publishing inside the transaction (O7).
//   - Admin.Handler, AdminHandlerConfig: the same as a JSON HTTP API,
//     behind the caller's authentication.
//   - AdminClient, NewAdminClient: that API's client, one method per
//     endpoint, with its bodies (RepairRequest, ResumeRequest,
//     ResumeResult, PlanRequest, ReasonRequest, PublishModeRequest,
//     PublishModeChange) shared with the handler, and ParseSince for the
//     since parameter; errors come back as the *problem.Problem of the
//     outbox/problem package, the module's one RFC 9457 writer.
//   - ErrActorRequired: every write names its actor and reason.
package operate

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/internal/pgtx"
	"github.com/outboxref/orders/internal/outbox/operate/internal/opsdb"
)

// Errors of the operations (Admin).
var (
	// ErrActorRequired means a write came without who made it or why: every
	// operator's write is audited with both.
	ErrActorRequired = errors.New("outbox admin: an actor and a reason are required")
	// ErrNotFound means no event (or plan) with that id is in the outbox.
	ErrNotFound = errors.New("outbox admin: not found")
	// ErrNotParked means the event exists but is not parked, so it cannot
	// be repaired or resumed.
	ErrNotParked = errors.New("outbox admin: event is not parked")
	// ErrNothingToChange means a repair named neither a payload nor a
	// schema version.
	ErrNothingToChange = errors.New("outbox admin: nothing to change")
	// ErrRepairRefused means a repair would write an event that the writer
	// refuses (it also matches the *InvalidEventError) or that fails the
	// service's own check (WithRepairCheck). Nothing was written.
	ErrRepairRefused = errors.New("outbox admin: repair refused")
)

// Actor is who makes an operator's write, and why. Both are recorded in
// outbox_audit with the time and hashes of the row before and after.
type Actor struct {
	Subject string
	Reason  string
}

func (a Actor) check() error {
	if strings.TrimSpace(a.Subject) == "" || strings.TrimSpace(a.Reason) == "" {
		return ErrActorRequired
	}
	return nil
}

// Admin is the outbox's operations (O4-O6): reports on the backlog and on
// parked events, repair and resume with the same event_id, audited replays,
// and the retention cleanup. A service exposes it to operators behind
// authentication; every write takes an Actor and is audited in the same
// transaction as the change. Admin is safe for concurrent use.
type Admin struct {
	pool        *pgxpool.Pool
	writer      *outbox.Writer
	repairCheck func(outbox.Event) error
	metrics     cleanupMetrics
	ownerPrefix string // host:pid, the start of every replay runner's owner token

	runsMu   sync.Mutex
	runs     int           // replay runs in the background
	runsIdle chan struct{} // closed when runs drops to zero
}

// AdminOption configures an Admin.
type AdminOption func(*Admin)

// WithRepairCheck adds the service's own check of a repaired event, run
// after the writer's checks (type, schema version, JSON Schema) and before
// anything is written. The outbox knows no domain, so what a schema cannot
// say is the service's to check: that an id in the payload is the
// aggregate's own, that an address is one plain address. A repair is an
// operator's hand-made event; without this check it could point an event
// at another aggregate, and the relay would deliver it. The check's error
// is returned wrapped in ErrRepairRefused and shown to the operator, so it
// names the field at fault and does not quote the value.
func WithRepairCheck(check func(outbox.Event) error) AdminOption {
	return func(a *Admin) { a.repairCheck = check }
}

// NewAdmin returns the operations over the outbox in pool. writer checks a
// repaired payload against the registered schemas before it is stored.
func NewAdmin(pool *pgxpool.Pool, writer *outbox.Writer, opts ...AdminOption) *Admin {
	a := &Admin{pool: pool, writer: writer, metrics: newCleanupMetrics(), ownerPrefix: ownerPrefix()}
	for _, o := range opts {
		o(a)
	}
	return a
}

// Collector returns the operations' metrics, for the service's registry:
// the cleanup's removed rows (outbox_cleanup_deleted_total{table}) and
// RunCleanup's runs (outbox_cleanup_runs_total{result}).
func (a *Admin) Collector() prometheus.Collector { return a.metrics }

// Stat is the count of events of one type in one state, and the oldest.
type Stat struct {
	EventType string    `json:"event_type"`
	State     string    `json:"state"`
	Count     int64     `json:"count"`
	Oldest    time.Time `json:"oldest"`
}

// Stats counts events by type and state, with the oldest of each. It reads
// the whole table: a report for an operator, not a metric.
func (a *Admin) Stats(ctx context.Context) ([]Stat, error) {
	rows, err := opsdb.New(a.pool).AdminStats(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox stats: %w", err)
	}
	out := make([]Stat, len(rows))
	for i, r := range rows {
		out[i] = Stat{EventType: r.EventType, State: r.State, Count: r.N, Oldest: r.Oldest}
	}
	return out, nil
}

// EventSummary is one event as listed for operators, without its payload.
type EventSummary struct {
	EventID          uuid.UUID `json:"event_id"`
	AggregateType    string    `json:"aggregate_type"`
	AggregateID      string    `json:"aggregate_id"`
	AggregateVersion int64     `json:"aggregate_version"`
	EventType        string    `json:"event_type"`
	SchemaVersion    int       `json:"schema_version"`
	CreatedAt        time.Time `json:"created_at"`
	Attempts         int       `json:"attempts"`
	ErrorClass       string    `json:"error_class,omitempty"`
	LastError        string    `json:"last_error,omitempty"`
}

// ParkedFilter narrows Parked. Zero fields match everything.
type ParkedFilter struct {
	EventType   string
	AggregateID string
	// Since keeps events whose last attempt was at or after it.
	Since time.Time
	// Limit bounds the list; 100 when zero.
	Limit int
}

// Parked lists parked events, oldest first, with the class and text of the
// failure that parked them.
func (a *Admin) Parked(ctx context.Context, f ParkedFilter) ([]EventSummary, error) {
	p := opsdb.AdminParkedParams{RowLimit: int32(f.Limit)}
	if p.RowLimit <= 0 {
		p.RowLimit = 100
	}
	p.EventType, p.AggregateID, p.Since = orNil(f.EventType), orNil(f.AggregateID), timeOrNil(f.Since)
	rows, err := opsdb.New(a.pool).AdminParked(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("list parked events: %w", err)
	}
	out := make([]EventSummary, len(rows))
	for i, r := range rows {
		out[i] = EventSummary{EventID: r.EventID, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
			AggregateVersion: r.AggregateVersion, EventType: r.EventType, SchemaVersion: int(r.SchemaVersion),
			CreatedAt: r.CreatedAt, Attempts: int(r.Attempts), ErrorClass: deref(r.LastErrorClass), LastError: deref(r.LastError)}
	}
	return out, nil
}

// EventDetail is one event with everything an operator may look at: its
// payload (admins only), delivery state, audit trail and replay history.
type EventDetail struct {
	EventSummary
	State string `json:"state"`
	// PublishMode is the mode the event was written in (O7): who sent it.
	PublishMode   string          `json:"publish_mode,omitempty"`
	Payload       json.RawMessage `json:"payload,omitempty"`
	Traceparent   string          `json:"traceparent,omitempty"`
	NextAttemptAt *time.Time      `json:"next_attempt_at,omitempty"`
	// RelayPartition is the partition of the aggregates the event belongs
	// to: the relay that owns it in outbox_relay_partition sends it.
	RelayPartition *int32 `json:"relay_partition,omitempty"`
	// LeaseOwner and LeaseExpiresAt are set only while a relay of the
	// version before partition ownership holds the row (a rolling upgrade).
	LeaseOwner      string     `json:"lease_owner,omitempty"`
	LeaseExpiresAt  *time.Time `json:"lease_expires_at,omitempty"`
	DeliveredAt     *time.Time `json:"delivered_at,omitempty"`
	BrokerPartition *int32     `json:"broker_partition,omitempty"`
	BrokerOffset    *int64     `json:"broker_offset,omitempty"`
	// Archived is set when the row was cleaned up: only its identity and
	// broker position remain.
	Archived bool           `json:"archived,omitempty"`
	Audit    []AuditEntry   `json:"audit"`
	Replays  []ReplayRecord `json:"replays"`
}

// AuditEntry is one operator's write.
type AuditEntry struct {
	At           time.Time       `json:"at"`
	Actor        string          `json:"actor"`
	Action       string          `json:"action"`
	Target       string          `json:"target"`
	Reason       string          `json:"reason"`
	BeforeSHA256 string          `json:"before_sha256,omitempty"`
	AfterSHA256  string          `json:"after_sha256,omitempty"`
	Detail       json.RawMessage `json:"detail,omitempty"`
}

// ReplayRecord is one replay of an event.
type ReplayRecord struct {
	PlanID      uuid.UUID  `json:"plan_id"`
	PlannedBy   string     `json:"planned_by"`
	Reason      string     `json:"reason"`
	PlanStatus  string     `json:"plan_status"`
	State       string     `json:"state"`
	PublishedAt *time.Time `json:"published_at,omitempty"`
	Partition   *int32     `json:"broker_partition,omitempty"`
	Offset      *int64     `json:"broker_offset,omitempty"`
}

// Event returns one event, from the outbox or, once cleaned up, from the
// archive, with its audit trail and replay history.
func (a *Admin) Event(ctx context.Context, id uuid.UUID) (EventDetail, error) {
	q := opsdb.New(a.pool)
	var d EventDetail
	row, err := q.AdminEventGet(ctx, id)
	switch {
	case err == nil:
		d = detailOf(row)
	case errors.Is(err, pgx.ErrNoRows):
		ar, aerr := q.AdminArchivedGet(ctx, id)
		if errors.Is(aerr, pgx.ErrNoRows) {
			return EventDetail{}, fmt.Errorf("event %s: %w", id, ErrNotFound)
		}
		if aerr != nil {
			return EventDetail{}, fmt.Errorf("read archived event %s: %w", id, aerr)
		}
		d = EventDetail{EventSummary: EventSummary{EventID: ar.EventID, AggregateType: ar.AggregateType, AggregateID: ar.AggregateID,
			AggregateVersion: ar.AggregateVersion, EventType: ar.EventType, SchemaVersion: int(ar.SchemaVersion), CreatedAt: ar.CreatedAt},
			State: "delivered", DeliveredAt: ar.DeliveredAt, BrokerPartition: ar.BrokerPartition, BrokerOffset: ar.BrokerOffset, Archived: true}
	default:
		return EventDetail{}, fmt.Errorf("read event %s: %w", id, err)
	}
	if d.Audit, err = a.audit(ctx, id.String()); err != nil {
		return EventDetail{}, err
	}
	replays, err := q.ReplayItemsForEvent(ctx, id)
	if err != nil {
		return EventDetail{}, fmt.Errorf("read replays of %s: %w", id, err)
	}
	d.Replays = make([]ReplayRecord, len(replays))
	for i, r := range replays {
		d.Replays[i] = ReplayRecord{PlanID: r.PlanID, PlannedBy: r.CreatedBy, Reason: r.Reason, PlanStatus: r.Status,
			State: r.State, PublishedAt: r.PublishedAt, Partition: r.BrokerPartition, Offset: r.BrokerOffset}
	}
	return d, nil
}

func (a *Admin) audit(ctx context.Context, target string) ([]AuditEntry, error) {
	rows, err := opsdb.New(a.pool).AuditForTarget(ctx, target)
	if err != nil {
		return nil, fmt.Errorf("read audit of %s: %w", target, err)
	}
	out := make([]AuditEntry, len(rows))
	for i, r := range rows {
		out[i] = AuditEntry{At: r.At, Actor: r.Actor, Action: r.Action, Target: r.Target, Reason: r.Reason,
			BeforeSHA256: fmt.Sprintf("%x", r.BeforeSha256), AfterSHA256: fmt.Sprintf("%x", r.AfterSha256), Detail: r.Detail}
	}
	return out, nil
}

// Repair is a change to a parked event: a new payload, a new schema
// version, or both. Zero fields keep the current value.
type Repair struct {
	Payload       json.RawMessage
	SchemaVersion int
}

// Repair replaces the payload or schema version of a parked event, after
// checking the result against the registered event type and schema as the
// writer checks a new event, then with the service's WithRepairCheck. The
// event keeps its event_id, version and attempts and stays parked: Resume
// sends it (two decisions, two audit entries). It is refused, with nothing
// written or audited, for an event that is not parked (ErrNotParked) or a
// result that fails either check (ErrRepairRefused).
func (a *Admin) Repair(ctx context.Context, id uuid.UUID, r Repair, actor Actor) (EventDetail, error) {
	if err := actor.check(); err != nil {
		return EventDetail{}, err
	}
	if r.Payload == nil && r.SchemaVersion == 0 {
		return EventDetail{}, ErrNothingToChange
	}
	err := pgtx.Run(ctx, a.pool, func(tx pgx.Tx) error {
		q := opsdb.New(tx)
		before, err := q.AdminEventLock(ctx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("event %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("lock event %s: %w", id, err)
		}
		if before.State != "parked" {
			return fmt.Errorf("event %s is %s: %w", id, before.State, ErrNotParked)
		}
		next := outbox.Event{ID: before.EventID, AggregateType: before.AggregateType, AggregateID: before.AggregateID,
			AggregateVersion: before.AggregateVersion, Type: before.EventType, SchemaVersion: int(before.SchemaVersion),
			Payload: before.Payload, Traceparent: deref(before.Traceparent)}
		if r.Payload != nil {
			next.Payload = r.Payload
		}
		if r.SchemaVersion != 0 {
			next.SchemaVersion = r.SchemaVersion
		}
		if err := a.writer.Validate([]outbox.Event{next}); err != nil {
			return fmt.Errorf("%w: %w", ErrRepairRefused, err)
		}
		if a.repairCheck != nil {
			if err := a.repairCheck(next); err != nil {
				return fmt.Errorf("%w: %w", ErrRepairRefused, err)
			}
		}
		after, err := q.AdminRepair(ctx, opsdb.AdminRepairParams{
			Payload: next.Payload, SchemaVersion: int32(next.SchemaVersion), EventID: id,
			Note: fmt.Sprintf("repaired by %s; was %s: %s", actor.Subject, deref(before.LastErrorClass), deref(before.LastError)),
		})
		if err != nil {
			return fmt.Errorf("repair event %s: %w", id, err)
		}
		detail, _ := json.Marshal(map[string]any{"schema_version": next.SchemaVersion, "payload_changed": r.Payload != nil,
			"previous_error_class": deref(before.LastErrorClass)})
		return writeAudit(ctx, q, actor, "repair", id.String(), rowHash(before), rowHash(after), detail)
	})
	if err != nil {
		return EventDetail{}, err
	}
	return a.Event(ctx, id)
}

// Resume puts parked events back to pending, due at once, with the same
// event_id, aggregate version and attempts: never a new event, so
// consumers recognise it and the strict order of its aggregate holds. It
// takes either event ids or an event type (all its parked events), and
// returns the ids it resumed; each gets its own audit entry.
func (a *Admin) Resume(ctx context.Context, ids []uuid.UUID, eventType string, actor Actor) ([]uuid.UUID, error) {
	if err := actor.check(); err != nil {
		return nil, err
	}
	if len(ids) == 0 && eventType == "" {
		return nil, ErrNothingToChange
	}
	typ := orNil(eventType)
	if ids == nil {
		ids = []uuid.UUID{}
	}
	var resumed []uuid.UUID
	err := pgtx.Run(ctx, a.pool, func(tx pgx.Tx) error {
		q := opsdb.New(tx)
		before, err := q.AdminParkedForResume(ctx, opsdb.AdminParkedForResumeParams{EventIDs: ids, EventType: typ})
		if err != nil {
			return fmt.Errorf("lock parked events: %w", err)
		}
		if len(before) == 0 {
			return fmt.Errorf("no parked event matches: %w", ErrNotParked)
		}
		if len(ids) > 0 && len(before) != len(ids) {
			return fmt.Errorf("%d of the %d events are parked: %w", len(before), len(ids), ErrNotParked)
		}
		after, err := q.AdminResume(ctx, opsdb.AdminResumeParams{EventIDs: ids, EventType: typ})
		if err != nil {
			return fmt.Errorf("resume events: %w", err)
		}
		afterByID := map[uuid.UUID]opsdb.Outbox{}
		for _, r := range after {
			afterByID[r.EventID] = r
		}
		for _, b := range before {
			detail, _ := json.Marshal(map[string]any{"previous_error_class": deref(b.LastErrorClass), "attempts": b.Attempts})
			if err := writeAudit(ctx, q, actor, "resume", b.EventID.String(), rowHash(b), rowHash(afterByID[b.EventID]), detail); err != nil {
				return err
			}
			resumed = append(resumed, b.EventID)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resumed, nil
}

func writeAudit(ctx context.Context, q *opsdb.Queries, actor Actor, action, target string, before, after []byte, detail []byte) error {
	if detail == nil {
		detail = []byte("{}")
	}
	if err := q.AuditInsert(ctx, opsdb.AuditInsertParams{Actor: actor.Subject, Action: action, Target: target,
		Reason: actor.Reason, BeforeSha256: before, AfterSha256: after, Detail: detail}); err != nil {
		return fmt.Errorf("audit %s of %s: %w", action, target, err)
	}
	return nil
}

// rowHash is the SHA-256 of a row's JSON encoding: enough to prove what an
// operator changed without copying the payload into the audit.
func rowHash(row opsdb.Outbox) []byte {
	b, _ := json.Marshal(row) // a struct of plain fields: cannot fail
	sum := sha256.Sum256(b)
	return sum[:]
}

func detailOf(r opsdb.Outbox) EventDetail {
	return EventDetail{
		EventSummary: EventSummary{EventID: r.EventID, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
			AggregateVersion: r.AggregateVersion, EventType: r.EventType, SchemaVersion: int(r.SchemaVersion),
			CreatedAt: r.CreatedAt, Attempts: int(r.Attempts), ErrorClass: deref(r.LastErrorClass), LastError: deref(r.LastError)},
		State: r.State, PublishMode: r.PublishMode, Payload: r.Payload, Traceparent: deref(r.Traceparent), NextAttemptAt: &r.NextAttemptAt,
		RelayPartition: &r.RelayPartition, LeaseOwner: deref(r.LeaseOwner), LeaseExpiresAt: r.LeaseExpiresAt, DeliveredAt: r.DeliveredAt,
		BrokerPartition: r.BrokerPartition, BrokerOffset: r.BrokerOffset,
	}
}

// orNil is v's address, or nil for the zero value: an optional filter as
// the generated queries take it (NULL matches everything).
func orNil[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// timeOrNil is orNil for a time, whose zero is told by IsZero.
func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
