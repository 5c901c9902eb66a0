// Package console is the operator console of the orders service: web
// pages over the outbox's operations (internal/outbox/operate, called in
// process) and the notifier's admin API (internal/notifyapi's client),
// served under /console.
//
// Pages are rendered on the server from html/template, which escapes
// every value (ids, reasons, error texts and payloads are the attacker's
// to choose). The few scripts (the overview's refresh, a bulk action's
// progress, confirm dialogs) are files of this package, embedded and
// served from /console/static/<version>/, and the Content-Security-Policy
// allows no other script, no inline script and no inline style.
//
// Access: an operator signs in with an AUTH_TOKENS token of the admin or
// viewer role; the console keeps a server-side session whose random id is
// the cookie (HttpOnly, SameSite=Strict, Secure over TLS, with an expiry).
// Every form carries the session's CSRF token and every POST is checked
// against it. A viewer sees every page and no write control, and a write
// from a viewer's session is refused; ReadOnly turns every write off for
// everyone. Writes go through operate.Admin with the signed-in subject as
// the actor, so the audit trail is the CLI's and the API's.
package console

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/notifyapi"
	"github.com/outboxref/orders/internal/outbox/adminguard"
	"github.com/outboxref/orders/internal/outbox/operate"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static/*
var staticFS embed.FS

// ContentSecurityPolicy is sent with every console response: scripts,
// styles and everything else only from the console itself, no inline
// script or style, no plugin, no framing, forms posting only here.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; object-src 'none'; " +
	"base-uri 'none'; frame-ancestors 'none'; form-action 'self'"

// DefaultSessionTTL is how long a sign-in lasts.
const DefaultSessionTTL = 8 * time.Hour

// Config is what the console needs.
type Config struct {
	Admin *operate.Admin
	// Policy and Target are the replay policy and producer, as the admin
	// API has them; Background bounds the replay runs and bulk actions
	// started from the console (cancel it when the service stops).
	Policy     operate.ReplayPolicy
	Target     func(context.Context) (operate.ReplayTarget, error)
	Background context.Context
	// Tokens authenticates the sign-in form (AUTH_TOKENS).
	Tokens *auth.Tokens
	// AggregateType is the aggregate type of the service's entity (for
	// the orders service, "order"): /console/orders/{id} shows its events.
	AggregateType string
	// Notifier is the notifier's admin API; nil when not configured, and
	// its parts of the pages say so.
	Notifier *notifyapi.Client
	// Lag reads the consumer groups' lag per partition from the broker;
	// nil leaves it off the overview.
	Lag func(context.Context) ([]PartitionLag, error)
	// ReadOnly hides every write control and refuses every write.
	ReadOnly bool
	// MailpitURL, TraceURL (a template with {trace_id}) and GrafanaURL add
	// links when set.
	MailpitURL string
	TraceURL   string
	GrafanaURL string
	SessionTTL time.Duration
	Log        *slog.Logger
}

// Console is the console's HTTP handler; mount it at /console/.
type Console struct {
	cfg      Config
	sessions *sessions
	jobs     *jobs
	pages    map[string]*template.Template
	static   http.Handler
	// version is a hash of the embedded static files, the part of their
	// URL that changes when they do, so a browser never runs a stale
	// script against a new page.
	version string
	mux     *http.ServeMux
}

// New returns the console.
func New(cfg Config) *Console {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Background == nil {
		cfg.Background = context.Background()
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.AggregateType == "" {
		cfg.AggregateType = "order"
	}
	c := &Console{cfg: cfg, sessions: newSessions(cfg.SessionTTL), jobs: newJobs(), version: staticVersion()}
	c.pages = parsePages(c.funcs())
	sub, _ := fs.Sub(staticFS, "static")
	c.static = http.StripPrefix("/console/static/"+c.version+"/", http.FileServerFS(sub))
	c.routes()
	return c
}

func staticVersion() string {
	h := sha256.New()
	_ = fs.WalkDir(staticFS, "static", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := staticFS.ReadFile(path)
			h.Write([]byte(path))
			h.Write(b)
		}
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)[:6])
}

func (c *Console) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /console/static/{version}/{file}", c.serveStatic)
	m.HandleFunc("GET /console/signin", c.signinPage)
	m.HandleFunc("POST /console/signin", c.signin)
	m.Handle("POST /console/signout", c.write(c.signout, false))

	m.Handle("GET /console/{$}", c.read(func(w http.ResponseWriter, r *http.Request, _ *session) {
		http.Redirect(w, r, "/console/overview", http.StatusSeeOther)
	}))
	m.Handle("GET /console/overview", c.read(c.overview))
	m.Handle("GET /console/overview/fragment", c.read(c.overviewFragment))
	m.Handle("GET /console/groups", c.read(c.groups))
	m.Handle("GET /console/groups/{fingerprint}", c.read(c.group))
	m.Handle("POST /console/groups/{fingerprint}/resume", c.write(c.groupResume, true))
	m.Handle("POST /console/groups/{fingerprint}/repair", c.write(c.groupRepair, true))
	m.Handle("GET /console/jobs/{id}", c.read(c.job))
	m.Handle("GET /console/jobs/{id}/progress", c.read(c.jobProgress))
	m.Handle("GET /console/search", c.read(c.search))
	m.Handle("GET /console/events/{id}", c.read(c.event))
	m.Handle("POST /console/events/{id}/resume", c.write(c.eventResume, true))
	m.Handle("GET /console/orders/{id}", c.read(c.order))
	m.Handle("GET /console/traces/{id}", c.read(c.trace))
	m.Handle("GET /console/replays", c.read(c.replayForm))
	m.Handle("POST /console/replays", c.write(c.replayPlan, true))
	m.Handle("GET /console/replays/{id}", c.read(c.replay))
	m.Handle("GET /console/replays/{id}/progress", c.read(c.replayProgress))
	m.Handle("POST /console/replays/{id}/approve", c.write(c.replayApprove, true))
	m.Handle("POST /console/replays/{id}/run", c.write(c.replayRun, true))
	m.Handle("GET /console/notifier", c.read(c.notifier))
	m.Handle("POST /console/notifier/emails/{key}/resolve", c.write(c.emailResolve, true))
	m.Handle("POST /console/notifier/parked/{id}/retry", c.write(c.parkedRetry, true))
	m.Handle("GET /console/audit", c.read(c.audit))
	c.mux = m
}

// ServeHTTP sets the security headers of every console response, checks
// the request's text (adminguard's rule: no control character, no bad
// UTF-8) and routes it.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("X-Frame-Options", "DENY")
	if err := adminguard.CheckText("path", r.URL.Path); err != nil {
		c.fail(w, r, nil, http.StatusBadRequest, err.Error())
		return
	}
	for k, vs := range r.URL.Query() {
		for _, v := range vs {
			if err := adminguard.CheckText(k, v); err != nil {
				c.fail(w, r, nil, http.StatusBadRequest, err.Error())
				return
			}
		}
	}
	c.mux.ServeHTTP(w, r)
}

func (c *Console) serveStatic(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("version") != c.version {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	c.static.ServeHTTP(w, r)
}

type pageHandler func(http.ResponseWriter, *http.Request, *session)

// read serves a page to a signed-in operator (admin or viewer); anyone
// else is sent to the sign-in form.
func (c *Console) read(h pageHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ss, ok := c.sessions.get(r)
		if !ok {
			http.Redirect(w, r, "/console/signin?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		h(w, r, ss)
	})
}

// maxFormBytes bounds a form: a reason, a few ids and fields.
const maxFormBytes = 64 << 10

// write checks a POST: a live session, the session's CSRF token and, for
// a change (change=true), the admin role and the console not being read
// only. Every form value must pass adminguard's text rule, the reason its
// reason rule.
func (c *Console) write(h pageHandler, change bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ss, ok := c.sessions.get(r)
		if !ok {
			c.fail(w, r, nil, http.StatusUnauthorized, "sign in first")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, ss, http.StatusBadRequest, "the form could not be read")
			return
		}
		if !ss.validCSRF(r.PostForm.Get("csrf")) {
			c.fail(w, r, ss, http.StatusForbidden, "the form's CSRF token is missing or wrong; reload the page and try again")
			return
		}
		if change && c.cfg.ReadOnly {
			c.fail(w, r, ss, http.StatusForbidden, "the console is read only (CONSOLE_READ_ONLY): no write is accepted")
			return
		}
		if change && !ss.principal.Role.CanWrite() {
			c.fail(w, r, ss, http.StatusForbidden, "the "+string(ss.principal.Role)+" role changes nothing; writes need the admin role")
			return
		}
		for k, vs := range r.PostForm {
			for _, v := range vs {
				if k == "ids" {
					// A list of ids may come one per line; each is then
					// parsed as a UUID.
					v = lineBreaks.Replace(v)
				}
				if err := adminguard.CheckText(k, v); err != nil {
					c.fail(w, r, ss, http.StatusBadRequest, err.Error())
					return
				}
			}
		}
		if err := adminguard.CheckReason(r.PostForm.Get("reason")); err != nil {
			c.fail(w, r, ss, http.StatusBadRequest, err.Error())
			return
		}
		h(w, r, ss)
	})
}

var lineBreaks = strings.NewReplacer("\r\n", " ", "\n", " ")

// actor is the signed-in subject and the form's reason, for the audit.
func actor(r *http.Request, ss *session) operate.Actor {
	return operate.Actor{Subject: ss.principal.Subject, Reason: strings.TrimSpace(r.PostForm.Get("reason"))}
}

func (c *Console) signinPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, nil, http.StatusOK, "signin", map[string]any{"Next": safeNext(r.URL.Query().Get("next"))})
}

// signin checks the token of the form. Only the admin and viewer roles
// may sign in: a customer's or the notifier's token is refused with the
// same answer as a wrong one, so the form tells nothing about a token.
func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, nil, http.StatusBadRequest, "the form could not be read")
		return
	}
	p, ok := c.cfg.Tokens.Lookup(r.PostForm.Get("token"))
	if !ok || !p.Role.IsOperator() {
		c.cfg.Log.WarnContext(r.Context(), "console sign-in refused", "remote_addr", r.RemoteAddr)
		c.render(w, r, nil, http.StatusUnauthorized, "signin", map[string]any{
			"Next": safeNext(r.PostForm.Get("next")), "Error": "This token does not open the console (an admin or viewer token is needed)."})
		return
	}
	id, ss := c.sessions.create(p)
	setCookie(w, r, id, ss.expires)
	c.cfg.Log.InfoContext(r.Context(), "console sign-in", "subject", p.Subject, "role", string(p.Role))
	http.Redirect(w, r, safeNext(r.PostForm.Get("next")), http.StatusSeeOther)
}

// safeNext keeps a redirect after sign-in inside the console.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/console/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\") {
		return "/console/overview"
	}
	return next
}

func (c *Console) signout(w http.ResponseWriter, r *http.Request, _ *session) {
	c.sessions.remove(r)
	clearCookie(w, r)
	http.Redirect(w, r, "/console/signin", http.StatusSeeOther)
}

// parseID reads a uuid path value.
func parseID(r *http.Request, name string) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PathValue(name))
	return id, err == nil
}
