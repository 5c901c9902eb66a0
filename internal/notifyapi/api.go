// Package notifyapi is the notifier's admin API (O4, S1): the HTTP port of
// notify.Admin, for operators holding a bearer token with the admin role.
//
//	GET  /admin/parked                        parked records (open ones; ?all=true for every one, ?after=ID to page)
//	                                          and held events parked
//	GET  /admin/parked/{id}                   one parked record, key, value and headers included
//	POST /admin/parked/{id}/retry             {"reason": "..."}: decode and process it again, now
//	GET  /admin/held                          events waiting for an earlier version of their order
//	POST /admin/held/{event_id}/drop          {"reason": "..."}: take a held event out of its order's sequence
//	GET  /admin/conflicts                     events that claimed a version another owns, and the verdict
//	GET  /admin/emails?state=unknown          send-ledger rows in a state
//	POST /admin/emails/{operation_key}/resolve {"resolution": "sent|resend|failed", "reason": "..."}
//	GET  /admin/events/{event_id}             the notifier's part of the event's journey: inbox marker, the
//	                                          order's inbox and projection versions, its ledger rows
//	                                          (?order_id= names the order when the notifier never saw the event)
//
// Every answer is JSON; every error an RFC 9457 problem. Input is checked
// before a handler runs, by the rule the outbox's operations share
// (adminguard): a NUL, bytes that are not UTF-8 or a control character in
// a path segment, a query value or a JSON string answers 400 naming the
// field, and a path with "." or ".." segments 404. A write needs a reason
// (400 without one, or with one longer than adminguard.MaxReasonChars
// characters) and is audited with the token's subject as the actor, in the
// transaction of the change (see notify.Admin). Without a token the answer
// is 401, with a token of another role 403: the health, readiness and
// metrics endpoints stay open, but nothing under /admin does.
package notifyapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/notify"
	"github.com/outboxref/orders/internal/outbox/adminguard"
	"github.com/outboxref/orders/internal/outbox/problem"
)

// Problem types, one per failure a client may handle differently.
const (
	TypeMalformed       = "urn:outboxref:problem:malformed-request"
	TypeValidation      = adminguard.TypeValidation
	TypeAlreadyResolved = "urn:outboxref:problem:already-resolved"
	TypeNotResolvable   = "urn:outboxref:problem:not-resolvable"
	TypeUnavailable     = "urn:outboxref:problem:unavailable"
	TypeDisabled        = "urn:outboxref:problem:admin-api-disabled"
)

// Page sizes of the lists.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// maxBodyBytes bounds a request body: a reason and a resolution.
const maxBodyBytes = 16 << 10

// Config is what the admin API needs.
type Config struct {
	Admin *notify.Admin
	// Tokens authenticates callers (AUTH_TOKENS). Nil disables the API:
	// every request under /admin is answered 404, saying so.
	Tokens *auth.Tokens
	Log    *slog.Logger
}

type api struct {
	admin *notify.Admin
	log   *slog.Logger
}

// New returns the handler of everything under /admin.
func New(cfg Config) http.Handler {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	a := &api{admin: cfg.Admin, log: cfg.Log}
	r := chi.NewRouter()
	r.Use(a.accessLog)
	if cfg.Tokens == nil {
		r.HandleFunc("/*", func(w http.ResponseWriter, _ *http.Request) {
			problem.Write(w, problem.Problem{Status: http.StatusNotFound, Type: TypeDisabled,
				Detail: "the admin API is disabled: the notifier was started without AUTH_TOKENS"})
		})
		return r
	}
	r.Use(cfg.Tokens.Middleware(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="notifier"`)
		problem.Write(w, problem.Problem{Status: http.StatusUnauthorized, Detail: "a valid bearer token is required"})
	}), requireAdmin)
	r.NotFound(func(w http.ResponseWriter, _ *http.Request) {
		problem.Write(w, problem.Problem{Status: http.StatusNotFound, Detail: "no such resource"})
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, _ *http.Request) {
		problem.Write(w, problem.Problem{Status: http.StatusMethodNotAllowed})
	})
	r.Group(func(r chi.Router) {
		// In a group, the guard runs once the route is matched, so it can
		// name a bad path segment after its parameter ("operation_key").
		r.Use(adminguard.Middleware(adminguard.Config{MaxBodyBytes: maxBodyBytes, Pattern: routePattern}))
		r.Get("/admin/parked", a.listParked)
		r.Get("/admin/parked/{id}", a.getParked)
		r.Post("/admin/parked/{id}/retry", a.retryParked)
		r.Get("/admin/held", a.listHeld)
		r.Post("/admin/held/{event_id}/drop", a.dropHeld)
		r.Get("/admin/conflicts", a.listConflicts)
		r.Get("/admin/emails", a.listEmails)
		r.Post("/admin/emails/{operation_key}/resolve", a.resolveEmail)
		r.Get("/admin/events/{event_id}", a.getJourney)
	})
	return r
}

func routePattern(r *http.Request) string { return chi.RouteContext(r.Context()).RoutePattern() }

// requireAdmin lets only the admin role through (S1).
func requireAdmin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, _ := auth.FromContext(r.Context())
		if sink, ok := r.Context().Value(principalSink{}).(*auth.Principal); ok {
			*sink = p
		}
		if p.Role != auth.RoleAdmin {
			problem.Write(w, problem.Problem{Status: http.StatusForbidden, Detail: "the admin role is required"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// accessLog logs each request at debug: who did what, with which status.
// Decisions are logged at info by notify.Admin; bodies never are.
func (a *api) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		var who auth.Principal
		next.ServeHTTP(sw, r.WithContext(withPrincipalSink(r.Context(), &who)))
		a.log.DebugContext(r.Context(), "admin request", slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", sw.status), slog.String("subject", who.Subject), slog.Duration("took", time.Since(start)))
	})
}

// principalSink is where accessLog, which runs before authentication,
// finds who the request turned out to be from.
type principalSink struct{}

func withPrincipalSink(ctx context.Context, p *auth.Principal) context.Context {
	return context.WithValue(ctx, principalSink{}, p)
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (a *api) listParked(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var fe []problem.FieldError
	limit := queryLimit(q.Get("limit"), &fe)
	var after int64
	if s := q.Get("after"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			fe = append(fe, problem.FieldError{Field: "after", Message: "must be a parked record id"})
		}
		after = n
	}
	all := false
	if s := q.Get("all"); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			fe = append(fe, problem.FieldError{Field: "all", Message: "must be true or false"})
		}
		all = b
	}
	if invalid(w, fe) {
		return
	}
	records, err := a.admin.ParkedRecords(r.Context(), inbox.ParkedListOptions{After: after, Limit: limit, IncludeResolved: all})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	out := ParkedList{Records: make([]ParkedRecord, 0, len(records)), Events: []ParkedEvent{}}
	for _, p := range records {
		out.Records = append(out.Records, parkedRecord(p, false))
	}
	if len(records) == limit {
		out.NextAfter = records[len(records)-1].ID
	}
	// Held events parked are few (a resync that found no aggregate, a
	// change that failed), and are listed whole on the first page.
	if after == 0 {
		events, err := a.admin.ParkedEvents(r.Context(), MaxLimit)
		if err != nil {
			a.fail(w, r, err)
			return
		}
		for _, e := range events {
			out.Events = append(out.Events, parkedEvent(e))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) getParked(w http.ResponseWriter, r *http.Request) {
	id, ok := parkedID(w, r)
	if !ok {
		return
	}
	p, err := a.admin.ParkedRecord(r.Context(), id)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, parkedRecord(p, true))
}

func (a *api) retryParked(w http.ResponseWriter, r *http.Request) {
	id, ok := parkedID(w, r)
	if !ok {
		return
	}
	var in RetryRequest
	if !decode(w, r, &in) || !reasonGiven(w, in.Reason) {
		return
	}
	p, _ := auth.FromContext(r.Context())
	res, err := a.admin.RetryParked(r.Context(), id, p.Subject, in.Reason)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	out := RetryResult{ParkedRecord: parkedRecord(res.Record, false), Resolution: string(res.Resolution),
		Outcome: string(res.Result.Outcome), AuditID: res.Audit.ID}
	if res.Err != nil {
		out.Error = res.Err.Error()
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) listHeld(w http.ResponseWriter, r *http.Request) {
	var fe []problem.FieldError
	limit := queryLimit(r.URL.Query().Get("limit"), &fe)
	if invalid(w, fe) {
		return
	}
	hs, err := a.admin.HeldEvents(r.Context(), limit)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	out := HeldList{Events: make([]HeldEvent, 0, len(hs))}
	for _, h := range hs {
		out.Events = append(out.Events, HeldEvent{EventID: h.Event.ID, AggregateType: h.Event.AggregateType, AggregateID: h.Event.AggregateID,
			AggregateVersion: h.Event.AggregateVersion, EventType: h.Event.Type, HeldAt: h.HeldAt})
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) dropHeld(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(chi.URLParam(r, "event_id"))
	if err != nil {
		problem.Write(w, problem.Problem{Status: http.StatusNotFound, Detail: "no held event with this id"})
		return
	}
	var in DropRequest
	if !decode(w, r, &in) || !reasonGiven(w, in.Reason) {
		return
	}
	p, _ := auth.FromContext(r.Context())
	res, err := a.admin.DropHeld(r.Context(), id, p.Subject, in.Reason)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, DropResult{EventID: res.Event.ID, AggregateID: res.Event.AggregateID,
		AggregateVersion: res.Event.AggregateVersion, EventType: res.Event.Type, AuditID: res.Audit.ID})
}

func (a *api) listConflicts(w http.ResponseWriter, r *http.Request) {
	var fe []problem.FieldError
	limit := queryLimit(r.URL.Query().Get("limit"), &fe)
	if invalid(w, fe) {
		return
	}
	cs, err := a.admin.Conflicts(r.Context(), limit)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	out := ConflictList{Conflicts: make([]Conflict, 0, len(cs))}
	for _, c := range cs {
		out.Conflicts = append(out.Conflicts, Conflict{EventID: c.Event.ID, AggregateType: c.Event.AggregateType,
			AggregateID: c.Event.AggregateID, AggregateVersion: c.Event.AggregateVersion, EventType: c.Event.Type,
			ExistingEventID: c.ExistingEventID, DetectedAt: c.DetectedAt, Resolution: c.Resolution, ResolvedAt: c.ResolvedAt})
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) listEmails(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var fe []problem.FieldError
	limit := queryLimit(q.Get("limit"), &fe)
	state := q.Get("state")
	if state == "" {
		state = notify.StateUnknown
	}
	if !slices.Contains(notify.LedgerStates, state) {
		fe = append(fe, problem.FieldError{Field: "state", Message: "must be one of " + strings.Join(notify.LedgerStates, ", ")})
	}
	if invalid(w, fe) {
		return
	}
	es, err := a.admin.Emails(r.Context(), state, limit)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	out := EmailList{State: state, Emails: make([]Email, 0, len(es))}
	for _, e := range es {
		out.Emails = append(out.Emails, email(e))
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) resolveEmail(w http.ResponseWriter, r *http.Request) {
	key := chi.URLParam(r, "operation_key")
	var in ResolveRequest
	if !decode(w, r, &in) {
		return
	}
	var fe []problem.FieldError
	switch in.Resolution {
	case notify.ResolveSent, notify.ResolveResend, notify.ResolveFailed:
	default:
		fe = append(fe, problem.FieldError{Field: "resolution", Message: "must be sent, resend or failed"})
	}
	if notify.CheckReason(in.Reason) != nil {
		fe = append(fe, reasonError)
	}
	if invalid(w, fe) {
		return
	}
	p, _ := auth.FromContext(r.Context())
	res, err := a.admin.ResolveEmail(r.Context(), key, in.Resolution, p.Subject, in.Reason)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ResolveResult{Email: email(res.Email), Resolution: in.Resolution, AuditID: res.Audit.ID})
}

func (a *api) getJourney(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(chi.URLParam(r, "event_id"))
	if err != nil {
		invalid(w, []problem.FieldError{{Field: "event_id", Message: "must be a UUID"}})
		return
	}
	var order *uuid.UUID
	if s := r.URL.Query().Get("order_id"); s != "" {
		o, err := uuid.Parse(s)
		if err != nil {
			invalid(w, []problem.FieldError{{Field: "order_id", Message: "must be a UUID"}})
			return
		}
		order = &o
	}
	j, err := a.admin.Journey(r.Context(), id, order)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, journey(j))
}

// fail maps the admin's errors to problems. An error it does not know is
// logged and answered 500 without its text.
func (a *api) fail(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, inbox.ErrParkedRecordNotFound):
		problem.Write(w, problem.Problem{Status: http.StatusNotFound, Detail: "no parked record with this id"})
	case errors.Is(err, inbox.ErrHeldEventNotFound):
		problem.Write(w, problem.Problem{Status: http.StatusNotFound, Detail: "no held or parked event with this id (never held, applied since, or dropped already)"})
	case errors.Is(err, notify.ErrEmailNotFound):
		problem.Write(w, problem.Problem{Status: http.StatusNotFound, Detail: "no email with this operation key"})
	case errors.Is(err, inbox.ErrAlreadyResolved):
		problem.Write(w, problem.Problem{Status: http.StatusConflict, Type: TypeAlreadyResolved,
			Detail: "this record's retry already went through; it is no longer parked"})
	case errors.Is(err, notify.ErrNotResolvable):
		problem.Write(w, problem.Problem{Status: http.StatusConflict, Type: TypeNotResolvable,
			Detail: "only an unknown or failed email can be resolved"})
	case errors.Is(err, notify.ErrInvalidReason):
		problem.Write(w, problem.Problem{Status: http.StatusBadRequest, Type: TypeValidation, Errors: []problem.FieldError{reasonError}})
	case inbox.IsTransient(err):
		a.log.WarnContext(r.Context(), "admin request failed: database unavailable", slog.String("path", r.URL.Path), slog.String("error", err.Error()))
		w.Header().Set("Retry-After", "5")
		problem.Write(w, problem.Problem{Status: http.StatusServiceUnavailable, Type: TypeUnavailable,
			Detail: "the database is unavailable; nothing was changed, try again"})
	default:
		a.log.ErrorContext(r.Context(), "admin request failed", slog.String("path", r.URL.Path), slog.String("error", err.Error()))
		problem.Write(w, problem.Problem{Status: http.StatusInternalServerError, Detail: "the request failed; see the notifier's log"})
	}
}

var reasonError = problem.FieldError{Field: "reason",
	Message: fmt.Sprintf("is required: say why, in one line of at most %d characters (it goes to the audit trail)", notify.MaxReasonChars)}

func reasonGiven(w http.ResponseWriter, reason string) bool {
	if notify.CheckReason(reason) != nil {
		invalid(w, []problem.FieldError{reasonError})
		return false
	}
	return true
}

// invalid answers 400 with the field errors, if there are any.
func invalid(w http.ResponseWriter, fe []problem.FieldError) bool {
	if len(fe) == 0 {
		return false
	}
	problem.Write(w, problem.Problem{Status: http.StatusBadRequest, Type: TypeValidation, Title: "Invalid request", Errors: fe})
	return true
}

func queryLimit(s string, fe *[]problem.FieldError) int {
	if s == "" {
		return DefaultLimit
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > MaxLimit {
		*fe = append(*fe, problem.FieldError{Field: "limit", Message: fmt.Sprintf("must be an integer from 1 to %d", MaxLimit)})
		return DefaultLimit
	}
	return n
}

func parkedID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(chi.URLParam(r, "id"), 10, 64)
	if err != nil || id < 1 {
		invalid(w, []problem.FieldError{{Field: "id", Message: "must be a parked record id (a positive integer)"}})
		return 0, false
	}
	return id, true
}

// decode reads a JSON body of at most maxBodyBytes with no unknown field.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("more than one JSON value")
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		problem.Write(w, problem.Problem{Status: http.StatusRequestEntityTooLarge, Detail: fmt.Sprintf("the body exceeds %d bytes", maxBodyBytes)})
		return false
	case err != nil:
		problem.Write(w, problem.Problem{Status: http.StatusBadRequest, Type: TypeMalformed, Detail: "the body is not the expected JSON object: " + err.Error()})
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
