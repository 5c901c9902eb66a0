package operate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/orders/internal/outbox/internal/pgtx"
	"github.com/outboxref/orders/internal/outbox/operate/internal/opsdb"
)

// Replay errors.
var (
	// ErrNeedsApproval means a plan must be approved by a second admin
	// before it runs: it selects by time range, or its events and those
	// its admin replayed alone within the window exceed the threshold.
	ErrNeedsApproval = errors.New("outbox replay: the plan needs a second admin's approval")
	// ErrApprovalExpired means a plan's approval is older than the
	// policy's ApprovalTTL: a second admin must approve it again.
	ErrApprovalExpired = errors.New("outbox replay: the approval has expired; a second admin must approve the plan again")
	// ErrSameApprover means the admin who planned a replay tried to approve
	// it: approval is a second person's decision.
	ErrSameApprover = errors.New("outbox replay: a plan is approved by an admin other than the one who planned it")
	// ErrPlanState means the plan is not in a state that allows the action
	// (approving a plan twice, running one that ran).
	ErrPlanState = errors.New("outbox replay: the plan's state does not allow this")
	// ErrTooManyEvents means a selection is larger than a plan may be.
	ErrTooManyEvents = errors.New("outbox replay: too many events for one plan; narrow the selection")
	// ErrBadSelector means a plan's selection is neither event ids nor a
	// valid time range.
	ErrBadSelector = errors.New("outbox replay: choose event ids, or a time range with from before to")
)

// Consumer is one consumer of the events, as the service's consumer
// registry documents it: what it reads, how long its inbox remembers an
// event it processed, and what a redelivered event makes it do. A replay
// plan uses it to say who will see the events and what may happen.
type Consumer struct {
	Name string `json:"name" yaml:"name"`
	// EventTypes it consumes; empty means every type.
	EventTypes []string `json:"event_types,omitempty" yaml:"event_types"`
	// InboxRetention is how long it remembers a processed event_id. An
	// event older than that looks new to it: a replay applies it again.
	InboxRetention time.Duration `json:"inbox_retention" yaml:"inbox_retention"`
	// SideEffects names, per event type, what processing the event does
	// outside the consumer's own database (for example "email to the
	// customer"): what a replay could repeat if the inbox has forgotten it.
	SideEffects map[string]string `json:"side_effects,omitempty" yaml:"side_effects"`
}

func (c Consumer) reads(eventType string) bool {
	return len(c.EventTypes) == 0 || slices.Contains(c.EventTypes, eventType)
}

// The policy's defaults, for its zero fields.
const (
	defaultApprovalWindow = 24 * time.Hour
	defaultApprovalTTL    = time.Hour
	defaultRunLease       = 30 * time.Second
)

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

func (p ReplayPolicy) window() time.Duration {
	return orDefault(p.ApprovalWindow, defaultApprovalWindow)
}
func (p ReplayPolicy) ttl() time.Duration   { return orDefault(p.ApprovalTTL, defaultApprovalTTL) }
func (p ReplayPolicy) lease() time.Duration { return orDefault(p.RunLease, defaultRunLease) }

// ReplayPolicy is the service's rules for replays.
type ReplayPolicy struct {
	// ApprovalThreshold is how many events one admin may replay alone
	// within ApprovalWindow: a plan whose events, added to those the admin
	// planned or ran without a second admin in the window, exceed it needs
	// a second admin's approval. Time-range plans always do.
	ApprovalThreshold int
	// ApprovalWindow is the rolling window of ApprovalThreshold; 24 hours
	// when zero. Counting per admin over a window, not per plan, is what
	// stops a large replay from being split into plans just under the
	// threshold.
	ApprovalWindow time.Duration
	// ApprovalTTL is how long an approval stays valid, counted on the
	// database's clock from when it was given; one hour when zero. An
	// approval is a judgement of the plan against the system as it was:
	// one left lying around for days should not start a replay.
	ApprovalTTL time.Duration
	// RunLease is how long a running plan stays its runner's without a
	// heartbeat (renewed every third of it); 30 seconds when zero. A plan
	// whose runner died is taken over once its lease has passed.
	RunLease time.Duration
	// MaxEvents bounds one plan; 10,000 when zero.
	MaxEvents int
	// Consumers is the consumer registry.
	Consumers []Consumer
}

// ReplaySelector chooses the events of a plan: exact event ids, or a time
// range of creation (From inclusive, To exclusive), optionally of one type.
type ReplaySelector struct {
	IDs  []uuid.UUID `json:"ids,omitempty"`
	From time.Time   `json:"from,omitzero"`
	To   time.Time   `json:"to,omitzero"`
	Type string      `json:"type,omitempty"`
}

func (s ReplaySelector) check() error {
	if (len(s.IDs) > 0) == (!s.From.IsZero() || !s.To.IsZero()) ||
		(len(s.IDs) == 0 && (s.From.IsZero() || s.To.IsZero() || !s.From.Before(s.To))) {
		return ErrBadSelector
	}
	return nil
}

// ReplayPlan is a stored plan and what it would do.
type ReplayPlan struct {
	ID            uuid.UUID      `json:"id"`
	CreatedAt     time.Time      `json:"created_at"`
	CreatedBy     string         `json:"created_by"`
	Reason        string         `json:"reason"`
	Selector      ReplaySelector `json:"selector"`
	Status        string         `json:"status"`
	NeedsApproval bool           `json:"needs_approval"`
	ApprovedBy    string         `json:"approved_by,omitempty"`
	ApprovedAt    *time.Time     `json:"approved_at,omitempty"`
	// ApprovalExpiresAt is when the approval stops allowing a run
	// (ApprovedAt plus the policy's ApprovalTTL).
	ApprovalExpiresAt *time.Time `json:"approval_expires_at,omitempty"`
	RunBy             string     `json:"run_by,omitempty"`
	RunError          string     `json:"run_error,omitempty"`
	// RunOwner names the runner (host, process and run) while the plan is
	// running, and RunLeaseExpiresAt when it counts as dead without a
	// heartbeat.
	RunOwner          string     `json:"run_owner,omitempty"`
	RunLeaseExpiresAt *time.Time `json:"run_lease_expires_at,omitempty"`
	// Counts are the events to publish, by type.
	Counts map[string]int `json:"counts"`
	// Events is the number of events to publish; Published how many are.
	Events    int `json:"events"`
	Published int `json:"published"`
	// Skipped lists events chosen but not replayable: archived by the
	// cleanup (only rows still in the outbox can be replayed), or not
	// delivered yet (the relay will send them).
	Skipped []SkippedEvent `json:"skipped,omitempty"`
	// Consumers says who will see the events and what they may do.
	Consumers []ConsumerImpact `json:"consumers"`
}

// SkippedEvent is an event a plan will not publish, and why.
type SkippedEvent struct {
	EventID   uuid.UUID `json:"event_id"`
	EventType string    `json:"event_type,omitempty"`
	Reason    string    `json:"reason"`
}

// ConsumerImpact is what a replay means for one consumer.
type ConsumerImpact struct {
	Name           string        `json:"name"`
	Events         int           `json:"events"`
	InboxRetention time.Duration `json:"inbox_retention"`
	// SideEffects of the events it will see, by event type.
	SideEffects map[string]string `json:"side_effects,omitempty"`
	// TooOld are the events older than its inbox retention: it may apply
	// them again, side effects included. One warning each.
	TooOld []uuid.UUID `json:"too_old,omitempty"`
}

// PlanReplay stores a plan for the selected events and returns what it
// would do. It publishes nothing. Only delivered rows still in the outbox
// are replayed, with their original event_id, key and headers; archived or
// undelivered ones are listed as skipped.
func (a *Admin) PlanReplay(ctx context.Context, sel ReplaySelector, policy ReplayPolicy, actor Actor) (ReplayPlan, error) {
	if err := actor.check(); err != nil {
		return ReplayPlan{}, err
	}
	if err := sel.check(); err != nil {
		return ReplayPlan{}, err
	}
	maxEvents := policy.MaxEvents
	if maxEvents <= 0 {
		maxEvents = 10_000
	}
	q := opsdb.New(a.pool)
	var (
		rows     []opsdb.ReplayEventsByIDsRow
		archived []opsdb.ArchivedByIDsRow
		err      error
	)
	if len(sel.IDs) > 0 {
		if len(sel.IDs) > maxEvents {
			return ReplayPlan{}, ErrTooManyEvents
		}
		if rows, err = q.ReplayEventsByIDs(ctx, sel.IDs); err == nil {
			archived, err = q.ArchivedByIDs(ctx, sel.IDs)
		}
	} else {
		typ := orNil(sel.Type)
		var r []opsdb.ReplayEventsByRangeRow
		if r, err = q.ReplayEventsByRange(ctx, opsdb.ReplayEventsByRangeParams{FromTime: sel.From, ToTime: sel.To, EventType: typ, RowLimit: int32(maxEvents + 1)}); err == nil {
			rows = make([]opsdb.ReplayEventsByIDsRow, len(r))
			for i := range r {
				rows[i] = opsdb.ReplayEventsByIDsRow(r[i])
			}
			var ar []opsdb.ArchivedByRangeRow
			if ar, err = q.ArchivedByRange(ctx, opsdb.ArchivedByRangeParams{FromTime: sel.From, ToTime: sel.To, EventType: typ, RowLimit: int32(maxEvents + 1)}); err == nil {
				archived = make([]opsdb.ArchivedByIDsRow, len(ar))
				for i := range ar {
					archived[i] = opsdb.ArchivedByIDsRow(ar[i])
				}
			}
		}
		if len(rows) > maxEvents {
			return ReplayPlan{}, ErrTooManyEvents
		}
	}
	if err != nil {
		return ReplayPlan{}, fmt.Errorf("select events to replay: %w", err)
	}

	plan := ReplayPlan{ID: uuid.New(), CreatedBy: actor.Subject, Reason: actor.Reason, Selector: sel, Status: "planned"}
	items := opsdb.ReplayItemsInsertParams{PlanID: plan.ID}
	add := func(id uuid.UUID, typ string, created time.Time, state string) {
		items.EventIDs = append(items.EventIDs, id)
		items.EventTypes = append(items.EventTypes, typ)
		items.CreatedAts = append(items.CreatedAts, created)
		items.States = append(items.States, state)
	}
	found := map[uuid.UUID]bool{}
	publish := 0
	for _, r := range rows {
		found[r.EventID] = true
		if r.State != "delivered" {
			plan.Skipped = append(plan.Skipped, SkippedEvent{EventID: r.EventID, EventType: r.EventType, Reason: "not delivered yet: the relay sends it"})
			continue
		}
		add(r.EventID, r.EventType, r.CreatedAt, "planned")
		publish++
	}
	for _, r := range archived {
		if found[r.EventID] {
			continue
		}
		found[r.EventID] = true
		add(r.EventID, r.EventType, r.CreatedAt, "skipped_archived")
	}
	for _, id := range sel.IDs {
		if !found[id] {
			plan.Skipped = append(plan.Skipped, SkippedEvent{EventID: id, Reason: "not in the outbox or its archive"})
		}
	}
	if publish == 0 {
		return ReplayPlan{}, fmt.Errorf("outbox replay: no delivered event in the outbox matches (%d skipped): %w", len(plan.Skipped)+len(archived), ErrNotFound)
	}
	selector, _ := json.Marshal(sel)
	err = pgtx.Run(ctx, a.pool, func(tx pgx.Tx) error {
		tq := opsdb.New(tx)
		why, err := fourEyes(ctx, tq, plan.ID, len(sel.IDs) == 0, publish, policy, actor.Subject)
		if err != nil {
			return err
		}
		plan.NeedsApproval = why != ""
		if err := tq.ReplayPlanInsert(ctx, opsdb.ReplayPlanInsertParams{ID: plan.ID, CreatedBy: actor.Subject, Reason: actor.Reason,
			Selector: selector, NeedsApproval: plan.NeedsApproval}); err != nil {
			return fmt.Errorf("store replay plan: %w", err)
		}
		if err := tq.ReplayItemsInsert(ctx, items); err != nil {
			return fmt.Errorf("store replay plan events: %w", err)
		}
		detail, _ := json.Marshal(map[string]any{"events": publish, "needs_approval": plan.NeedsApproval, "why": why, "selector": sel})
		return writeAudit(ctx, tq, actor, "replay_plan", plan.ID.String(), nil, nil, detail)
	})
	if err != nil {
		return ReplayPlan{}, err
	}
	return a.ReplayPlan(ctx, plan.ID, policy, plan.Skipped...)
}

// ReplayPlan reads a stored plan and recomputes what it means for each
// consumer in policy (the registry may have changed since it was planned).
// extra adds skipped events that are not stored with the plan.
func (a *Admin) ReplayPlan(ctx context.Context, id uuid.UUID, policy ReplayPolicy, extra ...SkippedEvent) (ReplayPlan, error) {
	q := opsdb.New(a.pool)
	p, err := q.ReplayPlanGet(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return ReplayPlan{}, fmt.Errorf("replay plan %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return ReplayPlan{}, fmt.Errorf("read replay plan %s: %w", id, err)
	}
	items, err := q.ReplayItems(ctx, id)
	if err != nil {
		return ReplayPlan{}, fmt.Errorf("read replay plan %s: %w", id, err)
	}
	plan := ReplayPlan{ID: p.ID, CreatedAt: p.CreatedAt, CreatedBy: p.CreatedBy, Reason: p.Reason, Status: p.Status,
		NeedsApproval: p.NeedsApproval, ApprovedBy: deref(p.ApprovedBy), ApprovedAt: p.ApprovedAt, RunBy: deref(p.RunBy),
		RunError: deref(p.RunError), RunOwner: deref(p.RunOwner), RunLeaseExpiresAt: p.RunLeaseExpiresAt,
		Counts: map[string]int{}, Skipped: extra}
	if p.ApprovedAt != nil {
		exp := p.ApprovedAt.Add(policy.ttl())
		plan.ApprovalExpiresAt = &exp
	}
	_ = json.Unmarshal(p.Selector, &plan.Selector)
	impacts := make([]ConsumerImpact, len(policy.Consumers))
	for i, c := range policy.Consumers {
		impacts[i] = ConsumerImpact{Name: c.Name, InboxRetention: c.InboxRetention, SideEffects: map[string]string{}}
	}
	now := time.Now()
	for _, it := range items {
		if it.State == "skipped_archived" {
			plan.Skipped = append(plan.Skipped, SkippedEvent{EventID: it.EventID, EventType: it.EventType,
				Reason: "archived by the retention cleanup: only rows still in the outbox can be replayed"})
			continue
		}
		plan.Events++
		plan.Counts[it.EventType]++
		if it.State == "published" {
			plan.Published++
		}
		for i, c := range policy.Consumers {
			if !c.reads(it.EventType) {
				continue
			}
			impacts[i].Events++
			if effect, ok := c.SideEffects[it.EventType]; ok {
				impacts[i].SideEffects[it.EventType] = effect
			}
			if c.InboxRetention > 0 && now.Sub(it.CreatedAt) > c.InboxRetention {
				impacts[i].TooOld = append(impacts[i].TooOld, it.EventID)
			}
		}
	}
	for _, imp := range impacts {
		if imp.Events > 0 {
			plan.Consumers = append(plan.Consumers, imp)
		}
	}
	sort.Slice(plan.Consumers, func(i, j int) bool { return plan.Consumers[i].Name < plan.Consumers[j].Name })
	return plan, nil
}

// ApproveReplay records a second admin's approval of a plan, valid for
// the policy's ApprovalTTL. The admin who planned it cannot approve it. A
// plan whose approval expired before it ran can be approved again.
func (a *Admin) ApproveReplay(ctx context.Context, id uuid.UUID, policy ReplayPolicy, actor Actor) (ReplayPlan, error) {
	if err := actor.check(); err != nil {
		return ReplayPlan{}, err
	}
	err := pgtx.Run(ctx, a.pool, func(tx pgx.Tx) error {
		q := opsdb.New(tx)
		row, err := lockPlan(ctx, q, id)
		if err != nil {
			return err
		}
		p := row.OutboxReplayPlan
		switch {
		case p.Status == "approved" && approvalExpired(p, row.DBNow, policy):
			// Approved again: the new approval's time replaces the old.
		case p.Status != "planned":
			return fmt.Errorf("plan is %s: %w", p.Status, ErrPlanState)
		}
		if p.CreatedBy == actor.Subject {
			return ErrSameApprover
		}
		if err := q.ReplayPlanApprove(ctx, opsdb.ReplayPlanApproveParams{ApprovedBy: &actor.Subject, ID: id}); err != nil {
			return fmt.Errorf("approve replay plan %s: %w", id, err)
		}
		return writeAudit(ctx, q, actor, "replay_approve", id.String(), nil, nil, nil)
	})
	if err != nil {
		return ReplayPlan{}, err
	}
	return a.ReplayPlan(ctx, id, policy)
}

func lockPlan(ctx context.Context, q *opsdb.Queries, id uuid.UUID) (opsdb.ReplayPlanLockRow, error) {
	row, err := q.ReplayPlanLock(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return row, fmt.Errorf("replay plan %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return row, fmt.Errorf("lock replay plan %s: %w", id, err)
	}
	return row, nil
}

// approvalExpired reports whether plan p's approval is older than the
// policy allows at now, the database's clock: a client cannot make an old
// approval look fresh.
func approvalExpired(p opsdb.OutboxReplayPlan, now time.Time, policy ReplayPolicy) bool {
	return p.ApprovedAt != nil && now.Sub(*p.ApprovedAt) > policy.ttl()
}

// fourEyes is the replay approval rule (O5), and the only place it is
// written: it returns why plan planID needs a second admin's approval, or
// "" when it does not. A time-range plan always does: its reach is
// decided by the data, not by the ids its admin read. A plan of ids does
// when its events, added to the events each of admins replayed alone
// within the policy's window, exceed the threshold: an admin replays alone
// the events of plans that needed no approval and that they planned or
// started in the window. Counting per admin over a window, rather than per
// plan, is what keeps a large replay from being split into small plans.
//
// It runs in the transaction that records the decision, after taking a
// lock per admin (in a fixed order, so two decisions cannot deadlock):
// two plans made at the same moment are counted against each other.
func fourEyes(ctx context.Context, q *opsdb.Queries, planID uuid.UUID, byRange bool, events int, policy ReplayPolicy, admins ...string) (string, error) {
	if byRange {
		return "a time-range plan always needs a second admin's approval", nil
	}
	admins = slices.Clone(admins)
	slices.Sort(admins)
	admins = slices.Compact(admins)
	for _, admin := range admins {
		if err := q.ReplaySoloEventsLock(ctx, admin); err != nil {
			return "", fmt.Errorf("lock the replay count of %s: %w", admin, err)
		}
	}
	window := policy.window()
	for _, admin := range admins {
		solo, err := q.ReplaySoloEvents(ctx, opsdb.ReplaySoloEventsParams{PlanID: planID, Admin: admin, WindowSeconds: window.Seconds()})
		if err != nil {
			return "", fmt.Errorf("count the replays of %s: %w", admin, err)
		}
		if int64(events)+solo > int64(policy.ApprovalThreshold) {
			return fmt.Sprintf("its %d events and the %d that %s replayed without a second admin in the last %s exceed the threshold of %d",
				events, solo, admin, window, policy.ApprovalThreshold), nil
		}
	}
	return "", nil
}

// startRun hands plan id to a new runner if it may run now, and returns
// the runner's owner token, which fences everything the run then writes.
// Whether a plan may run is decided here and nowhere else, in the
// transaction that marks it running: a planned plan must need no approval
// (fourEyes, counted again now that the admin may have replayed more), an
// approved one must have an approval younger than the policy's TTL, and a
// plan whose runner stopped (interrupted, or running on a lease that has
// passed) is continued without either check, since its run was allowed
// when it began. continueOnly restricts it to the last case: what a relay
// process takes over on its own.
//
// A planned plan that the rule now sends to a second admin is marked as
// needing approval, and ErrNeedsApproval returned; nothing else is
// written for a refusal.
func (a *Admin) startRun(ctx context.Context, id uuid.UUID, policy ReplayPolicy, actor Actor, continueOnly bool) (string, error) {
	owner := a.runOwner()
	var refused error
	err := pgtx.Run(ctx, a.pool, func(tx pgx.Tx) error {
		q := opsdb.New(tx)
		row, err := lockPlan(ctx, q, id)
		if err != nil {
			return err
		}
		p, now := row.OutboxReplayPlan, row.DBNow
		action := "replay_run"
		detail := map[string]any{"owner": owner}
		abandoned := p.Status == "running" && (p.RunLeaseExpiresAt == nil || p.RunLeaseExpiresAt.Before(now))
		switch {
		case p.Status == "interrupted" || abandoned:
			action = "replay_continue"
			detail["previous_status"], detail["previous_owner"] = p.Status, deref(p.RunOwner)
		case p.Status == "running":
			return fmt.Errorf("plan is running (runner %s, lease until %s): %w",
				deref(p.RunOwner), p.RunLeaseExpiresAt.Format(time.RFC3339), ErrPlanState)
		case continueOnly:
			return fmt.Errorf("plan is %s: %w", p.Status, ErrPlanState)
		case p.Status == "approved" && approvalExpired(p, now, policy):
			return fmt.Errorf("approved by %s at %s, %s ago; an approval is valid for %s: %w", deref(p.ApprovedBy),
				p.ApprovedAt.Format(time.RFC3339), now.Sub(*p.ApprovedAt).Round(time.Second), policy.ttl(), ErrApprovalExpired)
		case p.Status == "approved":
		case p.Status == "planned" && p.NeedsApproval:
			return fmt.Errorf("plan %s: %w", id, ErrNeedsApproval)
		case p.Status == "planned":
			items, err := q.ReplayItems(ctx, id)
			if err != nil {
				return fmt.Errorf("read replay plan %s: %w", id, err)
			}
			events := 0
			for _, it := range items {
				if it.State != "skipped_archived" {
					events++
				}
			}
			why, err := fourEyes(ctx, q, id, false, events, policy, p.CreatedBy, actor.Subject)
			if err != nil {
				return err
			}
			if why != "" {
				refused = fmt.Errorf("%s: %w", why, ErrNeedsApproval)
				// Committed with the refusal: the plan now shows, and
				// approve accepts, that it needs a second admin.
				return q.ReplayPlanRequireApproval(ctx, id)
			}
		default:
			return fmt.Errorf("plan is %s: %w", p.Status, ErrPlanState)
		}
		if err := q.ReplayPlanStart(ctx, opsdb.ReplayPlanStartParams{RunBy: actor.Subject, RunOwner: owner,
			LeaseSeconds: policy.lease().Seconds(), ID: id}); err != nil {
			return fmt.Errorf("start replay plan %s: %w", id, err)
		}
		b, _ := json.Marshal(detail)
		return writeAudit(ctx, q, actor, action, id.String(), nil, nil, b)
	})
	if err == nil {
		err = refused
	}
	if err != nil {
		return "", err
	}
	return owner, nil
}
