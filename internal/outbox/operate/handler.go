package operate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/adminguard"
	"github.com/outboxref/orders/internal/outbox/problem"
)

// AdminHandlerConfig wires the operations' HTTP API into a service.
type AdminHandlerConfig struct {
	// Actor returns who is calling, from the request's authentication. The
	// service mounts the handler behind its own authentication and an
	// admin-role check; Actor only names the caller for the audit.
	Actor func(*http.Request) string
	// Policy is the replay policy: approval threshold, window and TTL, the
	// runners' lease, and the consumer registry.
	Policy ReplayPolicy
	// Target returns where replays publish. It is called once per run, so a
	// service can create its producer on first use.
	Target func(context.Context) (ReplayTarget, error)
	// Background bounds replay runs, which outlive the request that starts
	// them: cancel it when the service stops, then call
	// Admin.WaitReplays. A run it stops is left interrupted, resumable.
	Background context.Context
	// Log receives failed requests and the end of replay runs.
	Log *slog.Logger
}

// Handler returns the operations as a JSON HTTP API, to be mounted under a
// prefix (such as /admin) behind the service's authentication:
//
//	GET  /stats                    counts and oldest event by type and state
//	GET  /events/parked            ?type=&aggregate=&since= (RFC 3339)
//	GET  /events/{id}              one event, payload, audit and replays
//	POST /events/{id}/repair       {"payload": …, "schema_version": n, "reason": "…"}
//	POST /events/resume            {"ids": […] | "type": "…", "reason": "…"}
//	POST /replays                  {"ids": […] | "from", "to", "type", "reason"}: a plan
//	GET  /replays/{id}             a plan and its progress
//	POST /replays/{id}/approve     {"reason": "…"}
//	POST /replays/{id}/run         {"reason": "…"}: 202, runs in the background
//	GET  /publish-modes            every event type's publish mode (O7)
//	PUT  /publish-modes/{type}     {"mode": "direct|shadow|outbox", "reason": "…"}
//	GET  /shadow-report            ?type=&since= (RFC 3339 or a duration; 24h by default)
//
// Every write requires a reason and is audited with the caller. The
// request and answer bodies are the types of client.go, which
// AdminClient sends and reads: one definition for both ends. Errors are
// problem documents (outbox/problem).
//
// Input is checked before any handler runs (adminguard): a path, query
// value or JSON string with a NUL, bytes that are not UTF-8 or a control
// character answers 400 naming the field, a reason longer than
// adminguard.MaxReasonChars too, and a path with "." or ".." segments 404
// instead of a redirect out of the prefix. Inside "payload" only NUL and
// bad UTF-8 are refused: a repaired payload may hold "\n" in its text.
func (a *Admin) Handler(cfg AdminHandlerConfig) http.Handler {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Background == nil {
		cfg.Background = context.Background()
	}
	h := &adminHandler{a: a, cfg: cfg}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats", h.stats)
	mux.HandleFunc("GET /events/parked", h.parked)
	mux.HandleFunc("GET /events/{id}", h.event)
	mux.HandleFunc("POST /events/{id}/repair", h.repair)
	mux.HandleFunc("POST /events/resume", h.resume)
	mux.HandleFunc("POST /replays", h.plan)
	mux.HandleFunc("GET /replays/{id}", h.showPlan)
	mux.HandleFunc("POST /replays/{id}/approve", h.approve)
	mux.HandleFunc("POST /replays/{id}/run", h.run)
	mux.HandleFunc("GET /publish-modes", h.publishModes)
	mux.HandleFunc("PUT /publish-modes/{type}", h.setPublishMode)
	mux.HandleFunc("GET /shadow-report", h.shadowReport)
	return adminguard.Middleware(adminguard.Config{
		MaxBodyBytes: maxAdminBody,
		Payload:      []string{"payload"},
		Pattern:      func(r *http.Request) string { _, p := mux.Handler(r); return p },
	})(mux)
}

type adminHandler struct {
	a   *Admin
	cfg AdminHandlerConfig
}

// maxAdminBody bounds a request body: a repaired payload is at most
// MaxPayloadBytes, plus a little JSON around it.
const maxAdminBody = outbox.MaxPayloadBytes + 16<<10

func (h *adminHandler) actor(r *http.Request, reason string) Actor {
	return Actor{Subject: h.cfg.Actor(r), Reason: strings.TrimSpace(reason)}
}

func (h *adminHandler) stats(w http.ResponseWriter, r *http.Request) {
	s, err := h.a.Stats(r.Context())
	h.reply(w, r, http.StatusOK, s, err)
}

func (h *adminHandler) parked(w http.ResponseWriter, r *http.Request) {
	f := ParkedFilter{EventType: r.URL.Query().Get("type"), AggregateID: r.URL.Query().Get("aggregate")}
	if s := r.URL.Query().Get("since"); s != "" {
		t, err := ParseSince(s)
		if err != nil {
			h.problem(w, http.StatusBadRequest, "since must be an RFC 3339 time or a duration such as 2h")
			return
		}
		f.Since = t
	}
	list, err := h.a.Parked(r.Context(), f)
	h.reply(w, r, http.StatusOK, list, err)
}

// ParseSince reads the since parameter of GET /events/parked and GET
// /shadow-report: an RFC 3339 time, or a duration back from now ("2h").
// AdminClient callers parse an operator's --since with it too, so both
// ends accept the same text.
func ParseSince(s string) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return time.Now().Add(-d), nil
	}
	return time.Parse(time.RFC3339, s)
}

func (h *adminHandler) event(w http.ResponseWriter, r *http.Request) {
	id, ok := h.id(w, r)
	if !ok {
		return
	}
	d, err := h.a.Event(r.Context(), id)
	h.reply(w, r, http.StatusOK, d, err)
}

func (h *adminHandler) repair(w http.ResponseWriter, r *http.Request) {
	id, ok := h.id(w, r)
	if !ok {
		return
	}
	var in RepairRequest
	if !h.decode(w, r, &in) {
		return
	}
	d, err := h.a.Repair(r.Context(), id, Repair{Payload: in.Payload, SchemaVersion: in.SchemaVersion}, h.actor(r, in.Reason))
	h.reply(w, r, http.StatusOK, d, err)
}

func (h *adminHandler) resume(w http.ResponseWriter, r *http.Request) {
	var in ResumeRequest
	if !h.decode(w, r, &in) {
		return
	}
	if len(in.IDs) > 0 && in.Type != "" {
		h.problem(w, http.StatusBadRequest, "give event ids or a type, not both")
		return
	}
	ids, err := h.a.Resume(r.Context(), in.IDs, in.Type, h.actor(r, in.Reason))
	h.reply(w, r, http.StatusOK, ResumeResult{Resumed: ids}, err)
}

func (h *adminHandler) plan(w http.ResponseWriter, r *http.Request) {
	var in PlanRequest
	if !h.decode(w, r, &in) {
		return
	}
	p, err := h.a.PlanReplay(r.Context(), in.ReplaySelector, h.cfg.Policy, h.actor(r, in.Reason))
	h.reply(w, r, http.StatusCreated, p, err)
}

func (h *adminHandler) showPlan(w http.ResponseWriter, r *http.Request) {
	id, ok := h.id(w, r)
	if !ok {
		return
	}
	p, err := h.a.ReplayPlan(r.Context(), id, h.cfg.Policy)
	h.reply(w, r, http.StatusOK, p, err)
}

func (h *adminHandler) approve(w http.ResponseWriter, r *http.Request) {
	id, ok := h.id(w, r)
	if !ok {
		return
	}
	var in ReasonRequest
	if !h.decode(w, r, &in) {
		return
	}
	p, err := h.a.ApproveReplay(r.Context(), id, h.cfg.Policy, h.actor(r, in.Reason))
	h.reply(w, r, http.StatusOK, p, err)
}

// run starts a replay in the background and answers 202 at once: a large
// plan at a bounded rate outlives any HTTP timeout. GET /replays/{id}
// follows its progress. Whether the plan may run is Admin.startRun's
// decision, made before the answer; the run itself follows
// cfg.Background, and a plan it leaves interrupted is continued by
// ResumeReplays or another run request.
func (h *adminHandler) run(w http.ResponseWriter, r *http.Request) {
	id, ok := h.id(w, r)
	if !ok {
		return
	}
	var in ReasonRequest
	if !h.decode(w, r, &in) {
		return
	}
	actor := h.actor(r, in.Reason)
	if err := actor.check(); err != nil {
		h.reply(w, r, 0, nil, err)
		return
	}
	// The producer comes first: a plan marked running must have a runner.
	target, err := h.cfg.Target(r.Context())
	if err != nil {
		h.reply(w, r, 0, nil, fmt.Errorf("replay producer: %w", err))
		return
	}
	if err := h.a.StartReplay(r.Context(), h.cfg.Background, id, target, h.cfg.Policy, actor, h.cfg.Log); err != nil {
		h.reply(w, r, 0, nil, err)
		return
	}
	p, err := h.a.ReplayPlan(r.Context(), id, h.cfg.Policy)
	h.reply(w, r, http.StatusAccepted, p, err)
}

func (h *adminHandler) publishModes(w http.ResponseWriter, r *http.Request) {
	list, err := h.a.PublishModes(r.Context())
	h.reply(w, r, http.StatusOK, list, err)
}

func (h *adminHandler) setPublishMode(w http.ResponseWriter, r *http.Request) {
	var in PublishModeRequest
	if !h.decode(w, r, &in) {
		return
	}
	typ := r.PathValue("type")
	before, err := h.a.SetPublishMode(r.Context(), h.actor(r, in.Reason), typ, in.Mode)
	h.reply(w, r, http.StatusOK, PublishModeChange{EventType: typ, From: before, To: in.Mode}, err)
}

func (h *adminHandler) shadowReport(w http.ResponseWriter, r *http.Request) {
	since := time.Now().Add(-24 * time.Hour)
	if s := r.URL.Query().Get("since"); s != "" {
		t, err := ParseSince(s)
		if err != nil {
			h.problem(w, http.StatusBadRequest, "since must be an RFC 3339 time or a duration such as 2h")
			return
		}
		since = t
	}
	rep, err := h.a.ShadowReport(r.Context(), r.URL.Query().Get("type"), since, 0)
	h.reply(w, r, http.StatusOK, rep, err)
}

func (h *adminHandler) id(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		h.problem(w, http.StatusNotFound, "no such id")
		return uuid.Nil, false
	}
	return id, true
}

func (h *adminHandler) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			h.problem(w, http.StatusRequestEntityTooLarge, "the body is too large")
			return false
		}
		h.problem(w, http.StatusBadRequest, "the body is not the JSON object this endpoint takes: "+err.Error())
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		h.problem(w, http.StatusBadRequest, "unexpected data after the JSON object")
		return false
	}
	return true
}

// reply writes v, or maps err to a problem: the operations' errors are the
// caller's to fix (4xx); anything else is logged and answered 500.
func (h *adminHandler) reply(w http.ResponseWriter, r *http.Request, status int, v any, err error) {
	var ie *outbox.InvalidEventError
	switch {
	case err == nil:
		writeAdminJSON(w, status, v)
	case errors.Is(err, ErrActorRequired), errors.Is(err, ErrNothingToChange), errors.Is(err, ErrInvalidPublishMode),
		errors.Is(err, ErrRepairRefused):
		h.problem(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, ErrNotFound):
		h.problem(w, http.StatusNotFound, err.Error())
	case errors.Is(err, ErrNotParked), errors.Is(err, ErrPlanState), errors.Is(err, ErrNeedsApproval), errors.Is(err, ErrSameApprover),
		errors.Is(err, ErrApprovalExpired):
		h.problem(w, http.StatusConflict, err.Error())
	case errors.As(err, &ie), errors.Is(err, ErrTooManyEvents), errors.Is(err, outbox.ErrUnknownEventType):
		h.problem(w, http.StatusUnprocessableEntity, err.Error())
	case errors.Is(err, ErrBadSelector):
		h.problem(w, http.StatusBadRequest, err.Error())
	default:
		h.cfg.Log.ErrorContext(r.Context(), "admin request failed", "path", r.URL.Path, "error", err.Error())
		h.problem(w, http.StatusInternalServerError, "internal error")
	}
}

// problem answers with a problem document of type about:blank: the status
// says what kind of failure it is, the detail which one.
func (h *adminHandler) problem(w http.ResponseWriter, status int, detail string) {
	problem.Write(w, problem.Problem{Status: status, Detail: detail})
}

func writeAdminJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
