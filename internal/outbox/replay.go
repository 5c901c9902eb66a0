package outbox

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
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox/cloudevents"
	"github.com/outboxref/orders/internal/outbox/outboxdb"
)

// Replay errors.
var (
	// ErrNeedsApproval means a plan must be approved by a second admin
	// before it runs.
	ErrNeedsApproval = errors.New("outbox replay: the plan needs a second admin's approval")
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

// ReplayPolicy is the service's rules for replays.
type ReplayPolicy struct {
	// ApprovalThreshold: a plan of more events than this needs a second
	// admin's approval. Time-range plans always do.
	ApprovalThreshold int
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
	RunBy         string         `json:"run_by,omitempty"`
	RunError      string         `json:"run_error,omitempty"`
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
	q := outboxdb.New(a.pool)
	var (
		rows     []outboxdb.ReplayEventsByIDsRow
		archived []outboxdb.ArchivedByIDsRow
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
		var typ *string
		if sel.Type != "" {
			typ = &sel.Type
		}
		var r []outboxdb.ReplayEventsByRangeRow
		if r, err = q.ReplayEventsByRange(ctx, outboxdb.ReplayEventsByRangeParams{FromTime: sel.From, ToTime: sel.To, EventType: typ, RowLimit: int32(maxEvents + 1)}); err == nil {
			rows = make([]outboxdb.ReplayEventsByIDsRow, len(r))
			for i := range r {
				rows[i] = outboxdb.ReplayEventsByIDsRow(r[i])
			}
			var ar []outboxdb.ArchivedByRangeRow
			if ar, err = q.ArchivedByRange(ctx, outboxdb.ArchivedByRangeParams{FromTime: sel.From, ToTime: sel.To, EventType: typ, RowLimit: int32(maxEvents + 1)}); err == nil {
				archived = make([]outboxdb.ArchivedByIDsRow, len(ar))
				for i := range ar {
					archived[i] = outboxdb.ArchivedByIDsRow(ar[i])
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
	items := outboxdb.ReplayItemsInsertParams{PlanID: plan.ID}
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
	plan.NeedsApproval = len(sel.IDs) == 0 || publish > policy.ApprovalThreshold
	selector, _ := json.Marshal(sel)
	err = inTx(ctx, a.pool, func(tx pgx.Tx) error {
		tq := outboxdb.New(tx)
		if err := tq.ReplayPlanInsert(ctx, outboxdb.ReplayPlanInsertParams{ID: plan.ID, CreatedBy: actor.Subject, Reason: actor.Reason,
			Selector: selector, NeedsApproval: plan.NeedsApproval}); err != nil {
			return fmt.Errorf("store replay plan: %w", err)
		}
		if err := tq.ReplayItemsInsert(ctx, items); err != nil {
			return fmt.Errorf("store replay plan events: %w", err)
		}
		detail, _ := json.Marshal(map[string]any{"events": publish, "needs_approval": plan.NeedsApproval, "selector": sel})
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
	q := outboxdb.New(a.pool)
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
		NeedsApproval: p.NeedsApproval, ApprovedBy: deref(p.ApprovedBy), RunBy: deref(p.RunBy), RunError: deref(p.RunError),
		Counts: map[string]int{}, Skipped: extra}
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

// ApproveReplay records a second admin's approval of a plan that needs
// one. The admin who planned it cannot approve it.
func (a *Admin) ApproveReplay(ctx context.Context, id uuid.UUID, policy ReplayPolicy, actor Actor) (ReplayPlan, error) {
	if err := actor.check(); err != nil {
		return ReplayPlan{}, err
	}
	err := inTx(ctx, a.pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		p, err := q.ReplayPlanLock(ctx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("replay plan %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("lock replay plan %s: %w", id, err)
		}
		switch {
		case p.Status != "planned":
			return fmt.Errorf("plan is %s: %w", p.Status, ErrPlanState)
		case p.CreatedBy == actor.Subject:
			return ErrSameApprover
		}
		if err := q.ReplayPlanApprove(ctx, outboxdb.ReplayPlanApproveParams{ApprovedBy: &actor.Subject, ID: id}); err != nil {
			return fmt.Errorf("approve replay plan %s: %w", id, err)
		}
		return writeAudit(ctx, q, actor, "replay_approve", id.String(), nil, nil, nil)
	})
	if err != nil {
		return ReplayPlan{}, err
	}
	return a.ReplayPlan(ctx, id, policy)
}

// ReplayTarget is where and how fast a replay publishes.
type ReplayTarget struct {
	// Client produces the records; the caller owns it. It should have the
	// relay's producer settings (acks from all in-sync replicas,
	// idempotence, the key partitioner).
	Client *kgo.Client
	Topic  string
	// Source is the ce_source of the records, as the relay writes it.
	Source string
	// Rate bounds the events published per second (R: consumers and the
	// broker are not flooded); 100 when zero.
	Rate float64
}

// RunReplay publishes the events of a plan that may run (planned and not
// needing approval, or approved), in creation order, each with its
// original event_id, key and headers, at most Rate per second, and records
// each publication in the event's replay history. It returns the plan as it
// ended. A failure stops the run and marks the plan failed; a plan is run
// once.
func (a *Admin) RunReplay(ctx context.Context, id uuid.UUID, target ReplayTarget, policy ReplayPolicy, actor Actor) (ReplayPlan, error) {
	if err := actor.check(); err != nil {
		return ReplayPlan{}, err
	}
	err := inTx(ctx, a.pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		p, err := q.ReplayPlanLock(ctx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("replay plan %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("lock replay plan %s: %w", id, err)
		}
		switch {
		case p.Status == "planned" && p.NeedsApproval:
			return ErrNeedsApproval
		case p.Status != "planned" && p.Status != "approved":
			return fmt.Errorf("plan is %s: %w", p.Status, ErrPlanState)
		}
		if err := q.ReplayPlanStart(ctx, outboxdb.ReplayPlanStartParams{RunBy: &actor.Subject, ID: id}); err != nil {
			return fmt.Errorf("start replay plan %s: %w", id, err)
		}
		return writeAudit(ctx, q, actor, "replay_run", id.String(), nil, nil, nil)
	})
	if err != nil {
		return ReplayPlan{}, err
	}
	runErr := a.publishReplay(ctx, id, target)
	status := "done"
	var msg *string
	if runErr != nil {
		status, msg = "failed", new(string)
		*msg = runErr.Error()
	}
	if err := outboxdb.New(a.pool).ReplayPlanEnd(context.WithoutCancel(ctx), outboxdb.ReplayPlanEndParams{Status: status, RunError: msg, ID: id}); err != nil {
		return ReplayPlan{}, errors.Join(runErr, fmt.Errorf("end replay plan %s: %w", id, err))
	}
	plan, err := a.ReplayPlan(context.WithoutCancel(ctx), id, policy)
	if err != nil {
		return ReplayPlan{}, errors.Join(runErr, err)
	}
	return plan, runErr
}

func (a *Admin) publishReplay(ctx context.Context, id uuid.UUID, target ReplayTarget) error {
	rate := target.Rate
	if rate <= 0 {
		rate = 100
	}
	q := outboxdb.New(a.pool)
	items, err := q.ReplayItems(ctx, id)
	if err != nil {
		return fmt.Errorf("read replay plan %s: %w", id, err)
	}
	var ids []uuid.UUID
	for _, it := range items {
		if it.State == "planned" {
			ids = append(ids, it.EventID)
		}
	}
	rows, err := q.ReplayEventsByIDs(ctx, ids)
	if err != nil {
		return fmt.Errorf("read events to replay: %w", err)
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for _, r := range rows {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		rec := cloudevents.Record(target.Topic, cloudevents.Event{
			ID: r.EventID, Type: r.EventType, Source: target.Source, Time: r.CreatedAt,
			AggregateType: r.AggregateType, AggregateID: r.AggregateID, AggregateVersion: r.AggregateVersion,
			SchemaVersion: int(r.SchemaVersion), Traceparent: deref(r.Traceparent), Data: r.Payload,
		})
		if err := target.Client.ProduceSync(ctx, rec).FirstErr(); err != nil {
			return fmt.Errorf("publish event %s: %w", r.EventID, err)
		}
		if err := q.ReplayItemPublished(ctx, outboxdb.ReplayItemPublishedParams{BrokerPartition: &rec.Partition, BrokerOffset: &rec.Offset,
			PlanID: id, EventID: r.EventID}); err != nil {
			return fmt.Errorf("record replay of %s: %w", r.EventID, err)
		}
	}
	return nil
}
