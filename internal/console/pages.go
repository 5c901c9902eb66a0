package console

import (
	"context"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/orders/internal/notifyapi"
	"github.com/outboxref/orders/internal/outbox/operate"
)

// TypeStat is one event type's backlog on the overview.
type TypeStat struct {
	EventType     string
	Pending       int64
	Parked        int64
	Delivered     int64
	OldestPending time.Time
}

// PartitionLag is a consumer group's lag on one partition.
type PartitionLag struct {
	Group     string
	Topic     string
	Partition int32
	Committed int64
	End       int64
	Lag       int64
}

// overviewData is the overview's content, also served as a fragment for
// its refresh.
type overviewData struct {
	Types       []TypeStat
	Relays      []operate.RelayLease
	RelayErr    string
	Lag         []PartitionLag
	LagErr      string
	Emails      map[string]string // state -> count ("1000+" past the API's page)
	NotifierErr string
	Groups      int
	At          time.Time
}

// heartbeats is where the overview reads the live relays: their heartbeat
// rows and the partitions each owns (internal/outbox/relay, "partitions").
func (c *Console) heartbeats(ctx context.Context) ([]operate.RelayLease, error) {
	return c.cfg.Admin.RelayLeases(ctx)
}

func (c *Console) overviewContent(ctx context.Context) overviewData {
	d := overviewData{At: time.Now(), Emails: map[string]string{}}
	stats, err := c.cfg.Admin.Stats(ctx)
	if err != nil {
		c.cfg.Log.ErrorContext(ctx, "console overview: stats", "error", err.Error())
	}
	byType := map[string]*TypeStat{}
	for _, s := range stats {
		t, ok := byType[s.EventType]
		if !ok {
			t = &TypeStat{EventType: s.EventType}
			byType[s.EventType] = t
		}
		switch s.State {
		case "pending":
			t.Pending, t.OldestPending = s.Count, s.Oldest
		case "parked":
			t.Parked = s.Count
		case "delivered":
			t.Delivered = s.Count
		}
	}
	for _, t := range byType {
		d.Types = append(d.Types, *t)
	}
	sort.Slice(d.Types, func(i, j int) bool { return d.Types[i].EventType < d.Types[j].EventType })
	if d.Relays, err = c.heartbeats(ctx); err != nil {
		d.RelayErr = "could not read the relays' leases"
	}
	if c.cfg.Lag == nil {
		d.LagErr = "consumer lag is not configured (CONSOLE_CONSUMER_GROUPS)"
	} else if d.Lag, err = c.cfg.Lag(ctx); err != nil {
		d.LagErr = "could not read the consumer lag from the broker: " + err.Error()
	}
	if groups, err := c.cfg.Admin.FailureGroups(ctx); err == nil {
		d.Groups = len(groups)
	}
	if cl, err := c.notifierClient(); err != nil {
		d.NotifierErr = err.Error()
	} else {
		for _, state := range []string{"unknown", "failed", "skipped"} {
			list, err := cl.Emails(ctx, state, notifyapi.MaxLimit)
			if err != nil {
				d.NotifierErr = "the notifier's admin API did not answer: " + err.Error()
				break
			}
			n := strconv.Itoa(len(list.Emails))
			if len(list.Emails) >= notifyapi.MaxLimit {
				n += "+"
			}
			d.Emails[state] = n
		}
	}
	return d
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request, ss *session) {
	c.render(w, r, ss, http.StatusOK, "overview", c.overviewContent(r.Context()))
}

func (c *Console) overviewFragment(w http.ResponseWriter, r *http.Request, _ *session) {
	c.renderFragment(w, r, "overview", "overview-body", c.overviewContent(r.Context()))
}

func (c *Console) groups(w http.ResponseWriter, r *http.Request, ss *session) {
	groups, err := c.cfg.Admin.FailureGroups(r.Context())
	if err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	total := 0
	for _, g := range groups {
		total += g.Count
	}
	c.render(w, r, ss, http.StatusOK, "groups", map[string]any{"Groups": groups, "Total": total})
}

// groupPageSize is how many of a group's events its page lists; the bulk
// actions take every event of the group, listed or not.
const groupPageSize = 100

func (c *Console) group(w http.ResponseWriter, r *http.Request, ss *session) {
	fp := r.PathValue("fingerprint")
	if !operate.ValidFingerprint(fp) {
		c.fail(w, r, ss, http.StatusNotFound, "no failure group has that fingerprint")
		return
	}
	g, ids, err := c.cfg.Admin.FailureGroupEvents(r.Context(), fp)
	if err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	shown := ids[:min(len(ids), groupPageSize)]
	events := make([]operate.EventSummary, 0, len(shown))
	for _, id := range shown {
		d, err := c.cfg.Admin.Event(r.Context(), id)
		if err != nil {
			continue // resumed meanwhile
		}
		events = append(events, d.EventSummary)
	}
	c.render(w, r, ss, http.StatusOK, "group", map[string]any{"Group": g, "Events": events, "More": len(ids) - len(shown)})
}

func (c *Console) groupResume(w http.ResponseWriter, r *http.Request, ss *session) {
	c.startBulk(w, r, ss, "resume", 0)
}

func (c *Console) groupRepair(w http.ResponseWriter, r *http.Request, ss *session) {
	v, err := strconv.Atoi(strings.TrimSpace(r.PostForm.Get("schema_version")))
	if err != nil || v < 1 {
		c.fail(w, r, ss, http.StatusBadRequest, "schema_version must be a whole number of at least 1")
		return
	}
	c.startBulk(w, r, ss, "repair", v)
}

// startBulk starts a bulk action over a whole failure group in the
// background and sends the operator to its progress page. The checks the
// operation makes (an actor and a reason) are made before it starts, so a
// refusal is shown here, not on the progress page.
func (c *Console) startBulk(w http.ResponseWriter, r *http.Request, ss *session, action string, schemaVersion int) {
	fp := r.PathValue("fingerprint")
	if !operate.ValidFingerprint(fp) {
		c.fail(w, r, ss, http.StatusNotFound, "no failure group has that fingerprint")
		return
	}
	a := actor(r, ss)
	if a.Reason == "" {
		c.failErr(w, r, ss, operate.ErrActorRequired)
		return
	}
	_, ids, err := c.cfg.Admin.FailureGroupEvents(r.Context(), fp)
	if err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	j := c.jobs.add(action, fp, a.Subject, len(ids))
	log := c.cfg.Log.With("job_id", j.ID, "fingerprint", fp, "actor", a.Subject, "action", action)
	go func() {
		var p operate.BulkProgress
		var err error
		if action == "resume" {
			p, err = c.cfg.Admin.ResumeGroup(c.cfg.Background, fp, a, 0, j.update)
		} else {
			p, err = c.cfg.Admin.RepairGroup(c.cfg.Background, fp, schemaVersion, a, j.update)
		}
		j.finish(p, err)
		if err != nil {
			log.Error("console bulk action failed", "error", err.Error(), "done", p.Done)
			return
		}
		log.Info("console bulk action done", "done", p.Done, "skipped", p.Skipped, "failed", p.Failed)
	}()
	http.Redirect(w, r, "/console/jobs/"+j.ID.String(), http.StatusSeeOther)
}

func (c *Console) job(w http.ResponseWriter, r *http.Request, ss *session) {
	id, ok := parseID(r, "id")
	j, found := c.jobs.get(id)
	if !ok || !found {
		c.fail(w, r, ss, http.StatusNotFound, "no such bulk action in this process")
		return
	}
	c.render(w, r, ss, http.StatusOK, "job", j.view())
}

func (c *Console) jobProgress(w http.ResponseWriter, r *http.Request, _ *session) {
	id, ok := parseID(r, "id")
	j, found := c.jobs.get(id)
	if !ok || !found {
		http.NotFound(w, r)
		return
	}
	c.renderFragment(w, r, "job", "job-body", j.view())
}

var traceIDRE = regexp.MustCompile(`^[0-9a-fA-F]{32}$`)

// search finds a journey by event id, order id or trace id.
func (c *Console) search(w http.ResponseWriter, r *http.Request, ss *session) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	if traceIDRE.MatchString(q) {
		http.Redirect(w, r, "/console/traces/"+strings.ToLower(q), http.StatusSeeOther)
		return
	}
	id, err := uuid.Parse(q)
	if err != nil {
		c.fail(w, r, ss, http.StatusBadRequest, "search takes an event id, an order id (UUIDs) or a trace id (32 hex digits)")
		return
	}
	if _, err := c.cfg.Admin.Event(r.Context(), id); err == nil {
		http.Redirect(w, r, "/console/events/"+id.String(), http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, "/console/orders/"+id.String(), http.StatusSeeOther)
}

// traceOf returns the trace id of a W3C traceparent.
func traceOf(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || len(parts[1]) != 32 {
		return ""
	}
	return parts[1]
}

// journey is one event's way through both services.
type journey struct {
	Event   operate.EventDetail
	TraceID string
	History []operate.AggregateEvent
	// Notify is the notifier's part: inbox marker, the order's inbox and
	// projection versions, its ledger rows.
	Notify notifyapi.Journey
	Parked []notifyapi.ParkedRecord
	// Notifier says why the notifier's part is missing, if it is.
	Notifier string
}

func (c *Console) event(w http.ResponseWriter, r *http.Request, ss *session) {
	id, ok := parseID(r, "id")
	if !ok {
		c.fail(w, r, ss, http.StatusNotFound, "an event id is a UUID")
		return
	}
	d, err := c.cfg.Admin.Event(r.Context(), id)
	if err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	j := journey{Event: d, TraceID: traceOf(d.Traceparent)}
	j.History, _ = c.cfg.Admin.EventsOfAggregate(r.Context(), d.AggregateType, d.AggregateID)
	c.notifierPart(r.Context(), &j)
	c.render(w, r, ss, http.StatusOK, "event", j)
}

// notifierPart adds what the notifier knows of the event, in one read of
// its admin API (GET /admin/events/{event_id}), and any parked record of
// it among the latest parked records.
func (c *Console) notifierPart(ctx context.Context, j *journey) {
	cl, err := c.notifierClient()
	if err != nil {
		j.Notifier = err.Error()
		return
	}
	var order *uuid.UUID
	if j.Event.AggregateType == c.cfg.AggregateType {
		if id, err := uuid.Parse(j.Event.AggregateID); err == nil {
			order = &id
		}
	}
	j.Notify, err = cl.Journey(ctx, j.Event.EventID, order)
	if err != nil {
		j.Notifier = "the notifier's admin API did not answer: " + err.Error()
		return
	}
	parked, err := cl.Parked(ctx, notifyapi.ParkedQuery{All: true, Limit: notifyapi.MaxLimit})
	if err == nil {
		for _, p := range parked.Records {
			if p.EventID != nil && *p.EventID == j.Event.EventID {
				j.Parked = append(j.Parked, p)
			}
		}
	}
}

func (c *Console) eventResume(w http.ResponseWriter, r *http.Request, ss *session) {
	id, ok := parseID(r, "id")
	if !ok {
		c.fail(w, r, ss, http.StatusNotFound, "an event id is a UUID")
		return
	}
	if _, err := c.cfg.Admin.Resume(r.Context(), []uuid.UUID{id}, "", actor(r, ss)); err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	http.Redirect(w, r, "/console/events/"+id.String(), http.StatusSeeOther)
}

func (c *Console) order(w http.ResponseWriter, r *http.Request, ss *session) {
	id, ok := parseID(r, "id")
	if !ok {
		c.fail(w, r, ss, http.StatusNotFound, "an order id is a UUID")
		return
	}
	events, err := c.cfg.Admin.EventsOfAggregate(r.Context(), c.cfg.AggregateType, id.String())
	if err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	if len(events) == 0 {
		c.fail(w, r, ss, http.StatusNotFound, "no event of this order is in the outbox (unknown order, or every event archived)")
		return
	}
	c.render(w, r, ss, http.StatusOK, "order", map[string]any{"OrderID": id, "Events": events})
}

func (c *Console) trace(w http.ResponseWriter, r *http.Request, ss *session) {
	tid := r.PathValue("id")
	if !traceIDRE.MatchString(tid) {
		c.fail(w, r, ss, http.StatusNotFound, "a trace id is 32 hex digits")
		return
	}
	events, err := c.cfg.Admin.EventsByTrace(r.Context(), strings.ToLower(tid))
	if err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	if len(events) == 1 {
		http.Redirect(w, r, "/console/events/"+events[0].EventID.String(), http.StatusSeeOther)
		return
	}
	c.render(w, r, ss, http.StatusOK, "trace", map[string]any{"TraceID": strings.ToLower(tid), "Events": events})
}

func (c *Console) replayForm(w http.ResponseWriter, r *http.Request, ss *session) {
	c.render(w, r, ss, http.StatusOK, "replays", nil)
}

// replayPlan stores a plan from the form: event ids (one per line or
// comma-separated), or a time range with an optional type.
func (c *Console) replayPlan(w http.ResponseWriter, r *http.Request, ss *session) {
	var sel operate.ReplaySelector
	for _, f := range strings.FieldsFunc(r.PostForm.Get("ids"), func(r rune) bool { return r == ',' || r == '\n' || r == ' ' || r == '\r' }) {
		id, err := uuid.Parse(f)
		if err != nil {
			c.fail(w, r, ss, http.StatusBadRequest, "ids: each must be an event id (UUID)")
			return
		}
		sel.IDs = append(sel.IDs, id)
	}
	for name, dst := range map[string]*time.Time{"from": &sel.From, "to": &sel.To} {
		if v := strings.TrimSpace(r.PostForm.Get(name)); v != "" {
			t, err := parseFormTime(v)
			if err != nil {
				c.fail(w, r, ss, http.StatusBadRequest, name+": want a time such as 2026-01-02T15:04 (UTC) or RFC 3339")
				return
			}
			*dst = t
		}
	}
	sel.Type = strings.TrimSpace(r.PostForm.Get("type"))
	p, err := c.cfg.Admin.PlanReplay(r.Context(), sel, c.cfg.Policy, actor(r, ss))
	if err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	http.Redirect(w, r, "/console/replays/"+p.ID.String(), http.StatusSeeOther)
}

func parseFormTime(v string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	return time.ParseInLocation("2006-01-02T15:04", v, time.UTC)
}

// replayView is the plan's page: the plan and what this operator may do.
type replayView struct {
	Plan operate.ReplayPlan
	// CanApprove is false for the planner: four eyes, and the operation
	// refuses the planner's approval too (operate.ErrSameApprover).
	CanApprove bool
	CanRun     bool
	Running    bool
}

func (c *Console) replayContent(r *http.Request, ss *session) (replayView, error) {
	id, ok := parseID(r, "id")
	if !ok {
		return replayView{}, operate.ErrNotFound
	}
	p, err := c.cfg.Admin.ReplayPlan(r.Context(), id, c.cfg.Policy)
	if err != nil {
		return replayView{}, err
	}
	me := ss.principal.Subject
	return replayView{Plan: p,
		CanApprove: p.Status == "planned" && p.NeedsApproval && p.CreatedBy != me,
		CanRun:     p.Status == "approved" || (p.Status == "planned" && !p.NeedsApproval) || p.Status == "interrupted",
		Running:    p.Status == "running"}, nil
}

func (c *Console) replay(w http.ResponseWriter, r *http.Request, ss *session) {
	v, err := c.replayContent(r, ss)
	if err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	c.render(w, r, ss, http.StatusOK, "replay", v)
}

func (c *Console) replayProgress(w http.ResponseWriter, r *http.Request, ss *session) {
	v, err := c.replayContent(r, ss)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	c.renderFragment(w, r, "replay", "replay-progress", v)
}

func (c *Console) replayApprove(w http.ResponseWriter, r *http.Request, ss *session) {
	id, ok := parseID(r, "id")
	if !ok {
		c.fail(w, r, ss, http.StatusNotFound, "a plan id is a UUID")
		return
	}
	if _, err := c.cfg.Admin.ApproveReplay(r.Context(), id, c.cfg.Policy, actor(r, ss)); err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	http.Redirect(w, r, "/console/replays/"+id.String(), http.StatusSeeOther)
}

func (c *Console) replayRun(w http.ResponseWriter, r *http.Request, ss *session) {
	id, ok := parseID(r, "id")
	if !ok {
		c.fail(w, r, ss, http.StatusNotFound, "a plan id is a UUID")
		return
	}
	a := actor(r, ss)
	if a.Reason == "" {
		c.failErr(w, r, ss, operate.ErrActorRequired)
		return
	}
	if c.cfg.Target == nil {
		c.fail(w, r, ss, http.StatusServiceUnavailable, "this process cannot publish replays")
		return
	}
	target, err := c.cfg.Target(r.Context())
	if err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	if err := c.cfg.Admin.StartReplay(r.Context(), c.cfg.Background, id, target, c.cfg.Policy, a, c.cfg.Log); err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	http.Redirect(w, r, "/console/replays/"+id.String(), http.StatusSeeOther)
}

// notifierView is the notifier's page.
type notifierView struct {
	Error     string
	Unknown   []notifyapi.Email
	Failed    []notifyapi.Email
	Parked    []notifyapi.ParkedRecord
	Held      []notifyapi.ParkedEvent
	Conflicts []notifyapi.Conflict
}

func (c *Console) notifier(w http.ResponseWriter, r *http.Request, ss *session) {
	var v notifierView
	cl, err := c.notifierClient()
	if err != nil {
		v.Error = err.Error()
		c.render(w, r, ss, http.StatusOK, "notifier", v)
		return
	}
	ctx := r.Context()
	unknown, err1 := cl.Emails(ctx, "unknown", 0)
	failed, err2 := cl.Emails(ctx, "failed", 0)
	parked, err3 := cl.Parked(ctx, notifyapi.ParkedQuery{})
	conflicts, err4 := cl.Conflicts(ctx, 0)
	for _, err := range []error{err1, err2, err3, err4} {
		if err != nil {
			v.Error = "the notifier's admin API did not answer: " + err.Error()
			break
		}
	}
	v.Unknown, v.Failed, v.Parked, v.Held, v.Conflicts = unknown.Emails, failed.Emails, parked.Records, parked.Events, conflicts.Conflicts
	c.render(w, r, ss, http.StatusOK, "notifier", v)
}

// viaConsole adds who used the console to a reason sent to the notifier,
// whose own audit names the console's token.
func viaConsole(r *http.Request, ss *session) string {
	return strings.TrimSpace(r.PostForm.Get("reason")) + " (console: " + ss.principal.Subject + ")"
}

func (c *Console) emailResolve(w http.ResponseWriter, r *http.Request, ss *session) {
	cl, err := c.notifierClient()
	if err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	if strings.TrimSpace(r.PostForm.Get("reason")) == "" {
		c.failErr(w, r, ss, operate.ErrActorRequired)
		return
	}
	res := r.PostForm.Get("resolution")
	if res != "sent" && res != "resend" && res != "failed" {
		c.fail(w, r, ss, http.StatusBadRequest, "resolution must be sent, resend or failed")
		return
	}
	if _, err := cl.ResolveEmail(r.Context(), r.PathValue("key"), res, viaConsole(r, ss)); err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	http.Redirect(w, r, "/console/notifier", http.StatusSeeOther)
}

func (c *Console) parkedRetry(w http.ResponseWriter, r *http.Request, ss *session) {
	cl, err := c.notifierClient()
	if err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		c.fail(w, r, ss, http.StatusNotFound, "a parked record id is a positive number")
		return
	}
	if strings.TrimSpace(r.PostForm.Get("reason")) == "" {
		c.failErr(w, r, ss, operate.ErrActorRequired)
		return
	}
	if _, err := cl.Retry(r.Context(), id, viaConsole(r, ss)); err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	http.Redirect(w, r, "/console/notifier", http.StatusSeeOther)
}

func (c *Console) audit(w http.ResponseWriter, r *http.Request, ss *session) {
	q := r.URL.Query()
	f := operate.AuditFilter{Actor: strings.TrimSpace(q.Get("actor")), Target: strings.TrimSpace(q.Get("target")), Limit: 500}
	for name, dst := range map[string]*time.Time{"from": &f.From, "to": &f.To} {
		if v := strings.TrimSpace(q.Get(name)); v != "" {
			t, err := parseFormTime(v)
			if err != nil {
				c.fail(w, r, ss, http.StatusBadRequest, name+": want a time such as 2026-01-02T15:04 (UTC) or RFC 3339")
				return
			}
			*dst = t
		}
	}
	entries, err := c.cfg.Admin.AuditLog(r.Context(), f)
	if err != nil {
		c.failErr(w, r, ss, err)
		return
	}
	c.render(w, r, ss, http.StatusOK, "audit", map[string]any{"Filter": map[string]string{
		"actor": q.Get("actor"), "target": q.Get("target"), "from": q.Get("from"), "to": q.Get("to")}, "Entries": entries})
}
