// Package ordersapi is the HTTP port of the order service.
//
// It authenticates the caller, decodes and bounds the request, maps the
// service's errors to RFC 9457 problems, and turns versions into ETags.
// It never publishes anything: a successful command has written its events
// to the outbox in the same transaction, and the relay delivers them (W2).
//
// Every request but the probes runs in an OpenTelemetry server span
// (otelhttp), a child of the caller's traceparent when it sent one. The
// commands take that span from the request context, and the outbox writer
// stores its trace context with the events (L4): the caller's raw header
// never reaches the outbox.
package ordersapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/google/uuid"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/migrate"
	"github.com/outboxref/orders/internal/orders"
	"github.com/outboxref/orders/internal/outbox/problem"
)

// MaxBodyBytes bounds a request body (W6); larger bodies get 413.
const MaxBodyBytes = 64 << 10

// Page sizes of GET /orders.
const (
	defaultPageSize = 20
	maxPageSize     = orders.MaxPageSize
)

// Config holds the handler's collaborators.
type Config struct {
	Service *orders.Service
	Tokens  *auth.Tokens
	Log     *slog.Logger
	// Ready reports whether the service can serve traffic: the database
	// is reachable and its schema is complete (O3). A broker outage is
	// absorbed by the outbox. An error wrapping migrate.ErrBehind is shown
	// to the caller; any other is logged and reported as the database
	// being unavailable.
	Ready func(ctx context.Context) error
	// Info adds informational fields to /readyz (for example the broker
	// state), which never affect readiness.
	Info func() map[string]string
	// Metrics serves /metrics.
	Metrics http.Handler
	// Admin, if set, serves the operations API under /admin, to callers
	// with the admin role only (O4, S1).
	Admin http.Handler
	// TracerProvider receives the server spans; nil means the global
	// provider. The caller's trace context is read with the global
	// propagator (W3C tracecontext and baggage in both services).
	TracerProvider trace.TracerProvider
}

type api struct {
	Config
}

// New returns the order API's HTTP handler.
func New(cfg Config) http.Handler {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	a := &api{cfg}
	r := chi.NewRouter()
	r.Use(serverSpan(cfg.TracerProvider), nameSpan, middleware.RequestID, a.accessLog, a.recoverer)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		problem.Write(w, problem.Problem{Status: http.StatusNotFound, Detail: "no such resource"})
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		problem.Write(w, problem.Problem{Status: http.StatusMethodNotAllowed})
	})

	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	r.Get("/readyz", a.readyz)
	if cfg.Metrics != nil {
		r.Method(http.MethodGet, "/metrics", cfg.Metrics)
	}

	r.Group(func(r chi.Router) {
		r.Use(cfg.Tokens.Middleware(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="orders"`)
			problem.Write(w, problem.Problem{Status: http.StatusUnauthorized, Detail: "a valid bearer token is required"})
		}))
		r.With(refuseViewer).Group(func(r chi.Router) {
			r.Post("/orders", a.createOrder)
			r.Get("/orders", a.listOrders)
			r.Get("/orders/{id}", a.getOrder)
			r.Get("/orders/{id}/events", a.getOrderEvents)
			r.Post("/orders/{id}/pay", a.payOrder)
			r.Post("/orders/{id}/cancel", a.cancelOrder)
			r.Post("/orders/{id}/ship", a.shipOrder)
		})
		if cfg.Admin != nil {
			r.With(requireAdmin).Mount("/admin", http.StripPrefix("/admin", cfg.Admin))
		}
	})
	return r
}

// serverSpan runs each request in an OpenTelemetry server span (otelhttp),
// a child of the caller's trace context when it sent one. It comes first,
// so that every log line of the request carries the span's ids.
func serverSpan(tp trace.TracerProvider) func(http.Handler) http.Handler {
	opts := []otelhttp.Option{
		// Probes and scrapes would be most of the spans and tell nothing.
		otelhttp.WithFilter(func(r *http.Request) bool {
			switch r.URL.Path {
			case "/healthz", "/readyz", "/metrics":
				return false
			}
			return true
		}),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }),
	}
	if tp != nil {
		opts = append(opts, otelhttp.WithTracerProvider(tp))
	}
	return otelhttp.NewMiddleware("orders", opts...)
}

// nameSpan names the server span after the route that served the request
// ("POST /orders/{id}/pay"), which chi knows only once routing is done. A
// name with the order id in it would make every request a span name of
// its own.
func nameSpan(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		if pattern := chi.RouteContext(r.Context()).RoutePattern(); pattern != "" {
			span := trace.SpanFromContext(r.Context())
			span.SetName(r.Method + " " + pattern)
			span.SetAttributes(attribute.String("http.route", pattern))
		}
	})
}

func (a *api) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	body := map[string]string{"status": "ok", "database": "ok"}
	if a.Info != nil {
		for k, v := range a.Info() {
			body[k] = v
		}
	}
	status := http.StatusOK
	if a.Ready != nil {
		switch err := a.Ready(ctx); {
		case errors.Is(err, migrate.ErrBehind):
			// Actionable and not sensitive: say which migrations are missing.
			status, body["status"], body["schema"] = http.StatusServiceUnavailable, "unavailable", err.Error()+"; run `orders migrate`"
		case err != nil:
			a.Log.WarnContext(ctx, "not ready: database unavailable", "error", err.Error())
			status, body["status"], body["database"] = http.StatusServiceUnavailable, "unavailable", "unavailable"
		}
	}
	writeJSON(w, status, body)
}

func (a *api) createOrder(w http.ResponseWriter, r *http.Request) {
	p, _ := auth.FromContext(r.Context())
	key := r.Header.Get("Idempotency-Key")
	if key != "" {
		if err := orders.ValidateIdempotencyKey(key); err != nil {
			a.fail(w, r, err)
			return
		}
	}
	var in orders.CreateInput
	if !a.decode(w, r, &in) {
		return
	}
	o, replayed, err := a.Service.Place(r.Context(), p, orders.PlaceOrder{Input: in, IdempotencyKey: key})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Location", "/orders/"+o.ID.String())
	writeOrder(w, http.StatusCreated, o)
}

func (a *api) getOrder(w http.ResponseWriter, r *http.Request) {
	p, _ := auth.FromContext(r.Context())
	id, ok := orderID(w, r)
	if !ok {
		return
	}
	o, err := a.Service.Get(r.Context(), p, id)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeOrder(w, http.StatusOK, o)
}

// orderEvents is the body of GET /orders/{id}/events.
type orderEvents struct {
	OrderID uuid.UUID    `json:"order_id"`
	Version int64        `json:"version"`
	Events  []orderEvent `json:"events"`
}

type orderEvent struct {
	Version   int64     `json:"version"`
	EventID   uuid.UUID `json:"event_id"`
	EventType string    `json:"event_type"`
}

// getOrderEvents answers which event_id owns each version of an order. The
// notifier asks it to tell the genuine event from a record that only claims
// a version (C7).
func (a *api) getOrderEvents(w http.ResponseWriter, r *http.Request) {
	p, _ := auth.FromContext(r.Context())
	id, ok := orderID(w, r)
	if !ok {
		return
	}
	h, err := a.Service.History(r.Context(), p, id)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	body := orderEvents{OrderID: h.OrderID, Version: h.Version, Events: make([]orderEvent, len(h.Events))}
	for i, e := range h.Events {
		body.Events[i] = orderEvent{Version: e.AggregateVersion, EventID: e.ID, EventType: e.Type}
	}
	w.Header().Set("ETag", etag(h.Version))
	writeJSON(w, http.StatusOK, body)
}

type orderList struct {
	Items      []orders.Order `json:"items"`
	NextCursor string         `json:"next_cursor,omitempty"`
}

func (a *api) listOrders(w http.ResponseWriter, r *http.Request) {
	p, _ := auth.FromContext(r.Context())
	var fe []orders.FieldError
	limit := defaultPageSize
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxPageSize {
			fe = append(fe, orders.FieldError{Field: "limit", Message: fmt.Sprintf("must be an integer from 1 to %d", maxPageSize)})
		}
		limit = n
	}
	var after *orders.Cursor
	if s := r.URL.Query().Get("cursor"); s != "" {
		c, err := decodeCursor(s)
		if err != nil {
			fe = append(fe, orders.FieldError{Field: "cursor", Message: "is not a cursor returned by this API"})
		}
		after = c
	}
	if len(fe) > 0 {
		problem.Write(w, problem.Problem{Status: http.StatusBadRequest, Type: typeValidation, Title: "Invalid query parameters", Errors: fieldErrors(fe)})
		return
	}
	list, next, err := a.Service.List(r.Context(), p, after, limit)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	out := orderList{Items: list}
	if next != nil {
		out.NextCursor = encodeCursor(*next)
	}
	writeJSON(w, http.StatusOK, out)
}

// payOrder handles POST /orders/{id}/pay.
func (a *api) payOrder(w http.ResponseWriter, r *http.Request) {
	p, id, version, ok := changeRequest(w, r)
	if !ok {
		return
	}
	o, err := a.Service.Pay(r.Context(), p, orders.PayOrder{ID: id, ExpectedVersion: version})
	a.writeChanged(w, r, o, err)
}

// cancelOrder handles POST /orders/{id}/cancel.
func (a *api) cancelOrder(w http.ResponseWriter, r *http.Request) {
	p, id, version, ok := changeRequest(w, r)
	if !ok {
		return
	}
	o, err := a.Service.Cancel(r.Context(), p, orders.CancelOrder{ID: id, ExpectedVersion: version})
	a.writeChanged(w, r, o, err)
}

// shipOrder handles POST /orders/{id}/ship.
func (a *api) shipOrder(w http.ResponseWriter, r *http.Request) {
	p, id, version, ok := changeRequest(w, r)
	if !ok {
		return
	}
	o, err := a.Service.Ship(r.Context(), p, orders.ShipOrder{ID: id, ExpectedVersion: version})
	a.writeChanged(w, r, o, err)
}

// changeRequest reads what every command on an existing order needs: the
// caller, the order id, and the version the client last saw (If-Match),
// which the service's conditional update enforces. It answers the request
// itself when one is missing or malformed.
func changeRequest(w http.ResponseWriter, r *http.Request) (auth.Principal, uuid.UUID, int64, bool) {
	p, _ := auth.FromContext(r.Context())
	id, ok := orderID(w, r)
	if !ok {
		return p, uuid.Nil, 0, false
	}
	version, ok := ifMatch(w, r)
	return p, id, version, ok
}

// writeChanged answers a command on an existing order: the order at its
// new version, or the problem.
func (a *api) writeChanged(w http.ResponseWriter, r *http.Request, o orders.Order, err error) {
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeOrder(w, http.StatusOK, o)
}

// fail maps a service error to its problem response. Anything unexpected
// is a 500 whose detail reveals nothing internal.
func (a *api) fail(w http.ResponseWriter, r *http.Request, err error) {
	var (
		ve *orders.ValidationError
		vc *orders.VersionConflictError
		te *orders.TransitionError
	)
	switch {
	case errors.As(err, &ve):
		problem.Write(w, problem.Problem{Status: http.StatusUnprocessableEntity, Type: typeValidation, Title: "Invalid order", Detail: "one or more fields are invalid", Errors: fieldErrors(ve.Fields)})
	case errors.Is(err, orders.ErrNotFound):
		problem.Write(w, problem.Problem{Status: http.StatusNotFound, Detail: "order not found"})
	case errors.Is(err, orders.ErrForbidden):
		problem.Write(w, problem.Problem{Status: http.StatusForbidden, Detail: "your role does not allow this command"})
	case errors.As(err, &vc):
		w.Header().Set("ETag", etag(vc.Current))
		problem.Write(w, problem.Problem{Status: http.StatusPreconditionFailed, Type: typeStaleVersion, Title: "Stale version",
			Detail:     fmt.Sprintf("If-Match names version %d but the order is at version %d; re-read it and retry", vc.Expected, vc.Current),
			Extensions: map[string]any{"current_version": vc.Current}})
	case errors.As(err, &te):
		problem.Write(w, problem.Problem{Status: http.StatusConflict, Type: typeIllegalState, Title: "Illegal transition", Detail: te.Error()})
	case errors.Is(err, orders.ErrIdempotencyKeyReused):
		problem.Write(w, problem.Problem{Status: http.StatusUnprocessableEntity, Type: typeIdempotencyReuse, Title: "Idempotency key reused",
			Detail: "this Idempotency-Key was already used with a different request body"})
	case errors.Is(err, orders.ErrEventTooLarge):
		// W6: the event that the request would produce is too large to
		// store; nothing was written.
		problem.Write(w, problem.Problem{Status: http.StatusRequestEntityTooLarge, Type: typeTooLarge, Title: "Event too large",
			Detail: "the request would produce an event larger than the outbox accepts; store large content elsewhere and reference it"})
	case errors.Is(err, orders.ErrCommitUnknown):
		a.Log.ErrorContext(r.Context(), "request failed during commit; outcome unknown", "method", r.Method, "path", r.URL.Path,
			"request_id", middleware.GetReqID(r.Context()), "error", err.Error())
		problem.Write(w, problem.Problem{Status: http.StatusInternalServerError, Type: typeCommitUnknown, Title: "Outcome unknown",
			Detail: "the database connection failed while committing; the command may or may not have taken effect. " +
				"Re-read the order (or retry a create with the same Idempotency-Key) before repeating it"})
	case errors.Is(err, orders.ErrUnavailable):
		// Nothing was committed: unlike the commit-unknown case, a plain
		// retry is safe.
		w.Header().Set("Retry-After", "1")
		problem.Write(w, problem.Problem{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Title: "Temporarily unavailable",
			Detail: "the command could not reach the database (or the broker) and nothing was committed; retry it after the Retry-After delay"})
	case errors.Is(err, context.Canceled):
		// The client went away; nothing useful can be written.
	default:
		a.Log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path,
			"request_id", middleware.GetReqID(r.Context()), "error", err.Error())
		problem.Write(w, problem.Problem{Status: http.StatusInternalServerError, Detail: "internal error; the request id is in the X-Request-Id header"})
	}
}

// decode reads a bounded JSON body into v, answering 413 or 400 itself
// when it cannot.
func (a *api) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	// The Content-Type is not checked: the body must simply be JSON, which
	// spares curl users the form-encoding default of -d. JSON is UTF-8:
	// encoding/json would turn each invalid byte into U+FFFD, storing (and
	// mailing) a value the client never sent, so such a body is refused.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err == nil && !utf8.Valid(body) {
		err = errors.New("the body is not valid UTF-8")
	}
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		err = dec.Decode(v)
		if err == nil && dec.More() {
			err = errors.New("unexpected data after the JSON object")
		} else if err == nil {
			if _, terr := dec.Token(); terr != io.EOF {
				err = errors.New("unexpected data after the JSON object")
			}
		}
	}
	if err == nil {
		return true
	}
	var (
		mbe *http.MaxBytesError
		ute *json.UnmarshalTypeError
		se  *json.SyntaxError
	)
	switch {
	case errors.As(err, &mbe):
		problem.Write(w, problem.Problem{Status: http.StatusRequestEntityTooLarge, Type: typeTooLarge, Title: "Request body too large",
			Detail: fmt.Sprintf("the body must be at most %d bytes", MaxBodyBytes)})
	case errors.As(err, &ute):
		field := ute.Field
		if field == "" {
			field = "(body)"
		}
		problem.Write(w, problem.Problem{Status: http.StatusBadRequest, Type: typeMalformed, Title: "Malformed request",
			Detail: fmt.Sprintf("%s must be a JSON %s", field, jsonKind(ute.Type.Kind().String())),
			Errors: []problem.FieldError{{Field: field, Message: "has the wrong JSON type"}}})
	case errors.As(err, &se), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		problem.Write(w, problem.Problem{Status: http.StatusBadRequest, Type: typeMalformed, Title: "Malformed request", Detail: "the body is not valid JSON"})
	default:
		// Unknown fields and trailing data.
		problem.Write(w, problem.Problem{Status: http.StatusBadRequest, Type: typeMalformed, Title: "Malformed request", Detail: err.Error()})
	}
	return false
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int", "int32", "int64":
		return "integer"
	case "slice":
		return "array"
	case "struct", "map":
		return "object"
	}
	return goKind
}

var etagRE = regexp.MustCompile(`^"([1-9][0-9]{0,17})"$`)

// ifMatch returns the version named by If-Match, answering 428 when the
// header is missing and 400 when it is not a version ETag.
func ifMatch(w http.ResponseWriter, r *http.Request) (int64, bool) {
	h := strings.TrimSpace(r.Header.Get("If-Match"))
	if h == "" {
		problem.Write(w, problem.Problem{Status: http.StatusPreconditionRequired, Type: typeIfMatchRequired, Title: "If-Match required",
			Detail: `send If-Match with the ETag of the order you read, e.g. If-Match: "1"`})
		return 0, false
	}
	m := etagRE.FindStringSubmatch(h)
	if m == nil {
		problem.Write(w, problem.Problem{Status: http.StatusBadRequest, Type: typeMalformed, Title: "Malformed If-Match",
			Detail: `If-Match must be one quoted version, e.g. "3"`, Errors: []problem.FieldError{{Field: "If-Match", Message: "is not a version ETag"}}})
		return 0, false
	}
	v, _ := strconv.ParseInt(m[1], 10, 64) // 18 digits at most: fits
	return v, true
}

func orderID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		// Not a UUID, so it names no order.
		problem.Write(w, problem.Problem{Status: http.StatusNotFound, Detail: "order not found"})
		return uuid.Nil, false
	}
	return id, true
}

func etag(version int64) string { return `"` + strconv.FormatInt(version, 10) + `"` }

func writeOrder(w http.ResponseWriter, status int, o orders.Order) {
	w.Header().Set("ETag", etag(o.Version))
	writeJSON(w, status, o)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func encodeCursor(c orders.Cursor) string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (*orders.Cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, err
	}
	var c orders.Cursor
	if err := json.Unmarshal(b, &c); err != nil || c.ID == uuid.Nil || c.CreatedAt.IsZero() {
		return nil, errors.New("bad cursor")
	}
	return &c, nil
}

// accessLog logs each request without headers: the Authorization header
// must never reach a log (O2).
func (a *api) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		w.Header().Set("X-Request-Id", middleware.GetReqID(r.Context()))
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		next.ServeHTTP(ww, r)
		a.Log.InfoContext(r.Context(), "http request", "method", r.Method, "path", r.URL.Path,
			"status", ww.Status(), "duration_ms", time.Since(start).Milliseconds(), "request_id", middleware.GetReqID(r.Context()))
	})
}

func (a *api) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if rec := recover(); rec != nil {
				if rec == http.ErrAbortHandler {
					panic(rec)
				}
				a.Log.ErrorContext(r.Context(), "panic serving request", "path", r.URL.Path, "panic", fmt.Sprint(rec),
					"request_id", middleware.GetReqID(r.Context()))
				problem.Write(w, problem.Problem{Status: http.StatusInternalServerError, Detail: "internal error"})
			}
		}()
		next.ServeHTTP(w, r)
	})
}
