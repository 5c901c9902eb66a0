package operate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox/cloudevents"
	"github.com/outboxref/orders/internal/outbox/operate/internal/opsdb"
)

// A replay's run outlives the process that starts it only through the
// database. The plan is marked running by one runner, whose owner token
// fences every write of the run, and kept alive by that runner's
// heartbeat. Each published event is recorded in its item before the next
// is sent, so the plan always knows the first event left to publish.
//
//   - A runner whose context ends (the process is stopping) finishes the
//     send in flight, records it, and marks the plan interrupted.
//   - A runner that dies (SIGKILL, a lost host) stops renewing its lease;
//     once it has passed, the plan counts as abandoned.
//
// Either way the plan is continued by the next runner from its first
// unpublished event: ResumeReplays, which every process that can publish
// replays runs, takes it over on its own, and `run` continues it too. An
// event is published twice by one plan only when a runner died between
// the broker's acknowledgement and its record (at most one event per
// death), which consumers absorb by event_id as they absorb every replay.

// errLostPlan means another runner took the plan over: this one must stop
// and write nothing more.
var errLostPlan = errors.New("outbox replay: another runner took the plan over")

// errLeaseLapsed means the runner could not renew its lease in time (the
// database was unreachable): another runner may take the plan, so this one
// stops publishing.
var errLeaseLapsed = errors.New("outbox replay: the runner's lease could not be renewed in time")

// resumerActor is who continues a plan on its own, in the audit.
var resumerActor = Actor{Subject: "system:replay-resumer", Reason: "continue a replay whose runner stopped"}

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

// RunReplay publishes the events of a plan that may run, in creation
// order, each with its original event_id, key and headers, at most Rate
// per second, and records each publication in the event's replay history.
// It returns the plan as it ended.
//
// A plan may run when it is planned and needs no second admin (counted
// over the policy's window, so an admin's earlier replays count), or is
// approved within the policy's ApprovalTTL; otherwise RunReplay returns
// ErrNeedsApproval, ErrApprovalExpired or ErrPlanState and writes nothing.
// It also continues a plan whose runner stopped (interrupted, or running
// on a lease that passed), from its first unpublished event.
//
// When ctx ends, the run finishes the send in flight, records it and
// leaves the plan interrupted, to be continued; the error then wraps
// ctx's. A broker or database failure marks the plan failed, for good.
func (a *Admin) RunReplay(ctx context.Context, id uuid.UUID, target ReplayTarget, policy ReplayPolicy, actor Actor) (ReplayPlan, error) {
	if err := actor.check(); err != nil {
		return ReplayPlan{}, err
	}
	owner, err := a.startRun(ctx, id, policy, actor, false)
	if err != nil {
		return ReplayPlan{}, err
	}
	runErr := a.runPlan(ctx, id, owner, target, policy)
	plan, err := a.ReplayPlan(context.WithoutCancel(ctx), id, policy)
	if err != nil {
		return ReplayPlan{}, errors.Join(runErr, err)
	}
	return plan, runErr
}

// ResumeReplays continues, until ctx ends, the replays whose runner
// stopped: plans interrupted when their process stopped, and plans left
// running by a runner that died, once its lease has passed. It looks at
// once and then every half RunLease, takes each such plan over (the
// database gives each to one process) and runs it in the background from
// its first unpublished event, audited as system:replay-resumer. target is
// called only when there is a plan to continue, so a process that never
// replays never creates a producer. Every process that can publish
// replays should run it; WaitReplays waits for the runs it started.
func (a *Admin) ResumeReplays(ctx context.Context, policy ReplayPolicy, target func(context.Context) (ReplayTarget, error), log *slog.Logger) {
	if log == nil {
		log = slog.Default()
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := a.resumeOnce(ctx, policy, target, log); err != nil && ctx.Err() == nil {
			log.ErrorContext(ctx, "replay resume: looking for interrupted replays failed", "error", err.Error())
		}
		t.Reset(policy.lease() / 2)
	}
}

func (a *Admin) resumeOnce(ctx context.Context, policy ReplayPolicy, target func(context.Context) (ReplayTarget, error), log *slog.Logger) error {
	ids, err := opsdb.New(a.pool).ReplayPlansToContinue(ctx, 10)
	if err != nil || len(ids) == 0 {
		return err
	}
	tg, err := target(ctx)
	if err != nil {
		return fmt.Errorf("replay producer: %w", err)
	}
	for _, id := range ids {
		owner, err := a.startRun(ctx, id, policy, resumerActor, true)
		if errors.Is(err, ErrPlanState) {
			continue // another process took it first
		}
		if err != nil {
			return err
		}
		log.InfoContext(ctx, "replay continued", "plan_id", id, "owner", owner)
		a.runInBackground(ctx, id, owner, tg, policy, log)
	}
	return nil
}

// runInBackground runs a started plan in a goroutine that WaitReplays
// waits for, and logs how it ended.
func (a *Admin) runInBackground(ctx context.Context, id uuid.UUID, owner string, target ReplayTarget, policy ReplayPolicy, log *slog.Logger) {
	done := a.trackRun()
	go func() {
		defer done()
		err := a.runPlan(ctx, id, owner, target, policy)
		switch {
		case err == nil:
			log.Info("replay done", "plan_id", id, "owner", owner)
		case ctx.Err() != nil:
			log.Info("replay interrupted; it continues from its first unpublished event", "plan_id", id, "owner", owner)
		case errors.Is(err, errLostPlan):
			log.Warn("replay taken over by another runner", "plan_id", id, "owner", owner)
		default:
			log.Error("replay failed", "plan_id", id, "owner", owner, "error", err.Error())
		}
	}()
}

// WaitReplays waits until the replay runs started in the background (by
// the HTTP API and ResumeReplays) have ended, or ctx ends. Call it at
// shutdown after ending the context those runs were given, so that each
// records where it stopped before the pool closes.
func (a *Admin) WaitReplays(ctx context.Context) error {
	a.runsMu.Lock()
	if a.runs == 0 {
		a.runsMu.Unlock()
		return nil
	}
	idle := a.runsIdle
	a.runsMu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("replay runs still recording their progress: %w", ctx.Err())
	}
}

// trackRun counts a background run until the returned func is called.
func (a *Admin) trackRun() func() {
	a.runsMu.Lock()
	defer a.runsMu.Unlock()
	if a.runs == 0 {
		a.runsIdle = make(chan struct{})
	}
	a.runs++
	return func() {
		a.runsMu.Lock()
		defer a.runsMu.Unlock()
		if a.runs--; a.runs == 0 {
			close(a.runsIdle)
		}
	}
}

// runOwner returns a token naming a new run: the host and process, for
// an operator reading the plan, and randomness, so that two runs of one
// process never share it.
func (a *Admin) runOwner() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return a.ownerPrefix + ":" + hex.EncodeToString(b)
}

func ownerPrefix() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

// runPlan publishes a started plan as owner and ends it: done, failed, or
// interrupted when ctx ended first. It writes nothing once another runner
// holds the plan.
func (a *Admin) runPlan(ctx context.Context, id uuid.UUID, owner string, target ReplayTarget, policy ReplayPolicy) error {
	runCtx, stop := context.WithCancelCause(ctx)
	heartbeat := make(chan struct{})
	go func() {
		defer close(heartbeat)
		a.heartbeat(runCtx, stop, id, owner, policy.lease())
	}()
	runErr := a.publishReplay(runCtx, id, owner, target, policy.lease())
	cause := context.Cause(runCtx)
	stop(nil)
	<-heartbeat

	status, msg := "done", ""
	switch {
	case errors.Is(runErr, errLostPlan) || errors.Is(cause, errLostPlan):
		return fmt.Errorf("replay plan %s: %w", id, errLostPlan)
	case runErr == nil:
	case errors.Is(cause, errLeaseLapsed):
		// Stopped, not failed: the plan continues from here.
		status, msg = "interrupted", cause.Error()
	case ctx.Err() != nil:
		status, msg = "interrupted", "interrupted: its runner stopped"
	default:
		status, msg = "failed", runErr.Error()
	}
	n, err := opsdb.New(a.pool).ReplayPlanEnd(context.WithoutCancel(ctx), opsdb.ReplayPlanEndParams{
		Status: status, RunError: orNil(msg), ID: id, RunOwner: owner})
	switch {
	case err != nil:
		return errors.Join(runErr, fmt.Errorf("end replay plan %s: %w", id, err))
	case n == 0:
		return fmt.Errorf("replay plan %s: %w", id, errLostPlan)
	case status == "interrupted":
		return fmt.Errorf("replay plan %s interrupted; it continues from its first unpublished event: %w", id, cause)
	}
	return runErr
}

// heartbeat renews the run's lease every third of it until ctx ends. It
// stops the run when another runner holds the plan, or when no renewal has
// succeeded for two thirds of the lease: by then the lease may pass before
// the next attempt, and the plan may go to another runner.
func (a *Admin) heartbeat(ctx context.Context, stop context.CancelCauseFunc, id uuid.UUID, owner string, lease time.Duration) {
	q := opsdb.New(a.pool)
	t := time.NewTicker(lease / 3)
	defer t.Stop()
	renewed := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		attempt := time.Now()
		n, err := q.ReplayPlanRenew(ctx, opsdb.ReplayPlanRenewParams{LeaseSeconds: lease.Seconds(), ID: id, RunOwner: owner})
		switch {
		case err == nil && n == 0:
			stop(errLostPlan)
			return
		case err == nil:
			renewed = attempt
		case time.Since(renewed) > 2*lease/3:
			stop(fmt.Errorf("%w: %v", errLeaseLapsed, err))
			return
		}
	}
}

// publishReplay publishes the plan's items still planned, in creation
// order. Between two sends it stops as soon as ctx ends; a send already
// started is finished (within half the lease) and recorded, so a clean
// stop never leaves a published event unrecorded.
func (a *Admin) publishReplay(ctx context.Context, id uuid.UUID, owner string, target ReplayTarget, lease time.Duration) error {
	rate := target.Rate
	if rate <= 0 {
		rate = 100
	}
	q := opsdb.New(a.pool)
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
			return context.Cause(ctx)
		case <-tick.C:
		}
		rec := cloudevents.Record(target.Topic, cloudevents.Event{
			ID: r.EventID, Type: r.EventType, Source: target.Source, Time: r.CreatedAt,
			AggregateType: r.AggregateType, AggregateID: r.AggregateID, AggregateVersion: r.AggregateVersion,
			SchemaVersion: int(r.SchemaVersion), Traceparent: deref(r.Traceparent), Data: r.Payload,
		})
		sendCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lease/2)
		err := target.Client.ProduceSync(sendCtx, rec).FirstErr()
		cancel()
		if err != nil {
			return fmt.Errorf("publish event %s: %w", r.EventID, err)
		}
		n, err := q.ReplayItemPublished(context.WithoutCancel(ctx), opsdb.ReplayItemPublishedParams{
			BrokerPartition: &rec.Partition, BrokerOffset: &rec.Offset, PlanID: id, EventID: r.EventID, RunOwner: owner})
		if err != nil {
			return fmt.Errorf("record replay of %s: %w", r.EventID, err)
		}
		if n == 0 {
			return errLostPlan
		}
	}
	return nil
}
