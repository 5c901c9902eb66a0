package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/console"
	"github.com/outboxref/orders/internal/orders"
	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/operate"
	"github.com/outboxref/orders/internal/pgtest"
)

const tokenSpec = "tok-alice=alice:admin,tok-bob=bob:admin,tok-vera=vera:viewer,tok-carl=carl:customer,tok-svc=notifier:service"

// env is one test's console over a fresh orders database.
type env struct {
	db    *pgtest.DB
	admin *operate.Admin
	srv   *httptest.Server
}

func setup(t *testing.T, mod func(*console.Config)) *env {
	t.Helper()
	db := pgtest.New(t, schema.Orders()...)
	types, err := orders.EventTypes()
	require.NoError(t, err)
	w, err := outbox.NewWriter(types)
	require.NoError(t, err)
	admin := operate.NewAdmin(db.Pool, w)
	tokens, err := auth.ParseTokens(tokenSpec)
	require.NoError(t, err)
	cfg := console.Config{Admin: admin, Tokens: tokens, Policy: operate.ReplayPolicy{ApprovalThreshold: 1}}
	if mod != nil {
		mod(&cfg)
	}
	srv := httptest.NewServer(console.New(cfg))
	t.Cleanup(srv.Close)
	return &env{db: db, admin: admin, srv: srv}
}

// insert writes order events with a plain INSERT, in state, with payload.
func (e *env) insert(t *testing.T, n int, state, payload string) []uuid.UUID {
	t.Helper()
	var ids []uuid.UUID
	for range n {
		id := uuid.New()
		_, err := e.db.Pool.Exec(context.Background(), `INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version,
			event_type, schema_version, payload, traceparent, state, delivered_at)
			VALUES ($1, 'order', $2, 1, 'order.placed', 1, $3, '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', $4,
			CASE WHEN $4 = 'delivered' THEN now() END)`, id, uuid.NewString(), payload, state)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	return ids
}

func (e *env) park(t *testing.T, text string, ids ...uuid.UUID) {
	t.Helper()
	_, err := e.db.Pool.Exec(context.Background(), `UPDATE outbox SET state = 'parked', last_error_class = 'schema', last_error = $2
		WHERE event_id = ANY($1)`, ids, text)
	require.NoError(t, err)
}

func (e *env) state(t *testing.T, id uuid.UUID) string {
	t.Helper()
	var s string
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT state FROM outbox WHERE event_id = $1`, id).Scan(&s))
	return s
}

// browser is one signed-in (or not) session: a cookie jar that does not
// follow redirects, so each answer is seen.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func (e *env) browser(t *testing.T) *browser {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &browser{t: t, base: e.srv.URL, c: &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browser) get(path string) (*http.Response, string) {
	b.t.Helper()
	resp, err := b.c.Get(b.base + path)
	require.NoError(b.t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

func (b *browser) post(path string, form url.Values) (*http.Response, string) {
	b.t.Helper()
	resp, err := b.c.PostForm(b.base+path, form)
	require.NoError(b.t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

func (e *env) signIn(t *testing.T, token string) *browser {
	t.Helper()
	b := e.browser(t)
	resp, _ := b.post("/console/signin", url.Values{"token": {token}, "next": {"/console/overview"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "sign-in with %s", token)
	return b
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf reads the session's CSRF token from a page's forms.
func (b *browser) csrf() string {
	b.t.Helper()
	_, body := b.get("/console/overview")
	m := csrfRE.FindStringSubmatch(body)
	require.NotNil(b.t, m, "every page has the sign-out form with the token")
	return m[1]
}

func TestSignIn(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)

	t.Run("PagesNeedASession", func(t *testing.T) {
		resp, _ := e.browser(t).get("/console/groups")
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		require.Equal(t, "/console/signin?next=%2Fconsole%2Fgroups", resp.Header.Get("Location"))
	})
	t.Run("OperatorsOnly", func(t *testing.T) {
		for _, tok := range []string{"tok-carl", "tok-svc", "wrong", ""} {
			b := e.browser(t)
			resp, body := b.post("/console/signin", url.Values{"token": {tok}})
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, tok)
			require.Empty(t, resp.Cookies(), tok)
			require.Contains(t, body, "does not open the console")
		}
	})
	t.Run("Cookie", func(t *testing.T) {
		b := e.browser(t)
		resp, _ := b.post("/console/signin", url.Values{"token": {"tok-alice"}, "next": {"https://evil.example/"}})
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		require.Equal(t, "/console/overview", resp.Header.Get("Location"), "a redirect never leaves the console")
		cookies := resp.Cookies()
		require.Len(t, cookies, 1)
		c := cookies[0]
		require.True(t, c.HttpOnly)
		require.Equal(t, http.SameSiteStrictMode, c.SameSite)
		require.False(t, c.Secure, "plain HTTP here; Secure when the request is TLS")
		require.Greater(t, c.MaxAge, 0)
		require.NotContains(t, c.Value, "tok-alice")
		require.GreaterOrEqual(t, len(c.Value), 40, "a random id")
		resp, _ = b.get("/console/overview")
		require.Equal(t, http.StatusOK, resp.StatusCode)

		// Signing out ends the session on the server, not only in the jar.
		old := c.Value
		resp, _ = b.post("/console/signout", url.Values{"csrf": {b.csrf()}})
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		replay := e.browser(t)
		u, _ := url.Parse(e.srv.URL + "/console/")
		replay.c.Jar.SetCookies(u, []*http.Cookie{{Name: "console_session", Value: old, Path: "/console"}})
		resp, _ = replay.get("/console/overview")
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, "the old cookie opens nothing")
	})
	t.Run("TLSCookieIsSecure", func(t *testing.T) {
		tokens, err := auth.ParseTokens(tokenSpec)
		require.NoError(t, err)
		srv := httptest.NewTLSServer(console.New(console.Config{Admin: e.admin, Tokens: tokens}))
		defer srv.Close()
		c := srv.Client()
		c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		resp, err := c.PostForm(srv.URL+"/console/signin", url.Values{"token": {"tok-vera"}})
		require.NoError(t, err)
		resp.Body.Close()
		require.Len(t, resp.Cookies(), 1)
		require.True(t, resp.Cookies()[0].Secure)
	})
}

// pages are every page of the console, for the checks every page passes.
func (e *env) pages(t *testing.T, event uuid.UUID, fingerprint string, plan uuid.UUID) []string {
	return []string{"/console/overview", "/console/overview/fragment", "/console/groups", "/console/groups/" + fingerprint,
		"/console/events/" + event.String(), "/console/replays", "/console/replays/" + plan.String(), "/console/notifier",
		"/console/audit", "/console/signin"}
}

var (
	inlineScript = regexp.MustCompile(`<script(?:\s[^>]*)?>[^<]`)
	scriptTag    = regexp.MustCompile(`<script[^>]*>`)
)

// TestPagesSafe renders every page, as an admin and as a viewer, and
// checks what every page must be: the Content-Security-Policy, no inline
// script or style, an attacker's payload and reason shown as text, and for
// the viewer no write control.
func TestPagesSafe(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	hostile := `{"note": "<script>alert(1)</script>", "x": "\"><img src=x onerror=alert(2)>"}`
	ids := e.insert(t, 3, "parked", hostile)
	e.park(t, `bad <script>alert(3)</script> value 7`, ids...)
	delivered := e.insert(t, 2, "delivered", `{"a": 1}`)
	groups, err := e.admin.FailureGroups(context.Background())
	require.NoError(t, err)
	require.Len(t, groups, 1)
	plan, err := e.admin.PlanReplay(context.Background(), operate.ReplaySelector{IDs: delivered},
		operate.ReplayPolicy{ApprovalThreshold: 1}, operate.Actor{Subject: "alice", Reason: "<script>alert(4)</script>"})
	require.NoError(t, err)

	for _, who := range []string{"tok-alice", "tok-vera"} {
		b := e.signIn(t, who)
		for _, p := range e.pages(t, ids[0], groups[0].Fingerprint, plan.ID) {
			resp, body := b.get(p)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s %s: %s", who, p, body)
			require.Equal(t, console.ContentSecurityPolicy, resp.Header.Get("Content-Security-Policy"), p)
			require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
			require.NotRegexp(t, inlineScript, body, "%s: no inline script", p)
			for _, tag := range scriptTag.FindAllString(body, -1) {
				require.Contains(t, tag, `src="/console/static/`, p)
			}
			require.NotContains(t, body, "style=", "%s: no inline style", p)
			require.NotContains(t, body, "<script>alert", "%s: hostile text is escaped", p)
			require.NotContains(t, body, "<img src=x", p)
			if who == "tok-vera" {
				forms := regexp.MustCompile(`<form[^>]*method="post"[^>]*>`).FindAllString(body, -1)
				for _, f := range forms {
					require.Regexp(t, `action="/console/sign(out|in)"`, f, "%s: a viewer sees no write control", p)
				}
			}
		}
		_, body := b.get("/console/events/" + ids[0].String())
		require.Contains(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;", "the payload is shown, as text")
		require.Contains(t, body, "not configured", "the notifier's part says it is missing")
		_, body = b.get("/console/groups")
		require.Contains(t, body, "bad &lt;script&gt;alert(&lt;n&gt;)&lt;/script&gt; value &lt;n&gt;")
		_, body = b.get("/console/replays/" + plan.ID.String())
		require.Contains(t, body, "&lt;script&gt;alert(4)&lt;/script&gt;")
	}

	t.Run("Static", func(t *testing.T) {
		b := e.signIn(t, "tok-alice")
		_, body := b.get("/console/overview")
		src := regexp.MustCompile(`src="(/console/static/[0-9a-f]+/console\.js)"`).FindStringSubmatch(body)
		require.NotNil(t, src)
		resp, js := e.browser(t).get(src[1])
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Contains(t, js, "data-confirm")
		require.Contains(t, resp.Header.Get("Cache-Control"), "immutable")
		resp, _ = e.browser(t).get("/console/static/000000000000/console.js")
		require.Equal(t, http.StatusNotFound, resp.StatusCode, "another version is not served")
	})
}

// TestWrites is the gate of every write: the CSRF token, the role, the
// read-only switch and the reason. Each refusal leaves the event parked;
// the last, allowed, write resumes it with an audit entry naming alice.
func TestWrites(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ids := e.insert(t, 1, "parked", `{"a": 1}`)
	e.park(t, "x", ids...)
	path := "/console/events/" + ids[0].String() + "/resume"

	alice := e.signIn(t, "tok-alice")
	token := alice.csrf()
	vera := e.signIn(t, "tok-vera")

	for _, tc := range []struct {
		name   string
		b      *browser
		form   url.Values
		status int
	}{
		{"NoSession", e.browser(t), url.Values{"csrf": {token}, "reason": {"r"}}, http.StatusUnauthorized},
		{"NoCSRF", alice, url.Values{"reason": {"r"}}, http.StatusForbidden},
		{"WrongCSRF", alice, url.Values{"csrf": {"x" + token}, "reason": {"r"}}, http.StatusForbidden},
		{"AnotherSessionsCSRF", vera, url.Values{"csrf": {token}, "reason": {"r"}}, http.StatusForbidden},
		{"Viewer", vera, url.Values{"csrf": {vera.csrf()}, "reason": {"r"}}, http.StatusForbidden},
		{"NoReason", alice, url.Values{"csrf": {token}}, http.StatusBadRequest},
		{"ControlCharacter", alice, url.Values{"csrf": {token}, "reason": {"a\x1bb"}}, http.StatusBadRequest},
		{"LongReason", alice, url.Values{"csrf": {token}, "reason": {strings.Repeat("r", 1025)}}, http.StatusBadRequest},
	} {
		resp, body := tc.b.post(path, tc.form)
		require.Equal(t, tc.status, resp.StatusCode, "%s: %s", tc.name, body)
		require.Equal(t, "parked", e.state(t, ids[0]), tc.name)
	}

	resp, _ := alice.post(path, url.Values{"csrf": {token}, "reason": {"fixed upstream"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "pending", e.state(t, ids[0]))
	entries, err := e.admin.AuditLog(context.Background(), operate.AuditFilter{Target: ids[0].String()})
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, "alice", entries[0].Actor)
	require.Equal(t, "fixed upstream", entries[0].Reason)
}

func TestReadOnly(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *console.Config) { c.ReadOnly = true })
	ids := e.insert(t, 2, "parked", `{"a": 1}`)
	e.park(t, "x", ids...)
	groups, err := e.admin.FailureGroups(context.Background())
	require.NoError(t, err)

	alice := e.signIn(t, "tok-alice")
	_, body := alice.get("/console/groups/" + groups[0].Fingerprint)
	require.Contains(t, body, "Read only")
	require.NotContains(t, body, "/resume\"", "no write control")
	resp, _ := alice.post("/console/groups/"+groups[0].Fingerprint+"/resume", url.Values{"csrf": {alice.csrf()}, "reason": {"r"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Equal(t, "parked", e.state(t, ids[0]))
}

// TestBulkResume resumes a whole failure group from its page, larger than
// the page, and follows the job to the end.
func TestBulkResume(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ids := e.insert(t, 250, "parked", `{"a": 1}`)
	for i, id := range ids {
		e.park(t, fmt.Sprintf("order %d: schema v%d unknown", i, i%3+2), id)
	}
	other := e.insert(t, 1, "parked", `{"a": 1}`)
	e.park(t, "something else entirely", other...)
	groups, err := e.admin.FailureGroups(context.Background())
	require.NoError(t, err)
	fp := groups[0].Fingerprint

	alice := e.signIn(t, "tok-alice")
	_, body := alice.get("/console/groups/" + fp)
	require.Contains(t, body, "This will resume <strong>250</strong> events")
	require.Contains(t, body, "And 150 more")
	resp, _ := alice.post("/console/groups/"+fp+"/resume", url.Values{"csrf": {alice.csrf()}, "reason": {"schema deployed"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	job := resp.Header.Get("Location")
	require.True(t, strings.HasPrefix(job, "/console/jobs/"), job)
	require.Eventually(t, func() bool {
		_, body := alice.get(job + "/progress")
		return strings.Contains(body, "data-finished")
	}, 20*time.Second, 50*time.Millisecond)
	_, body = alice.get(job)
	require.Contains(t, body, `<span id="job-done">250</span> of 250 done`)

	var parked int
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE state = 'parked'`).Scan(&parked))
	require.Equal(t, 1, parked, "only the other group is left")
	entries, err := e.admin.AuditLog(context.Background(), operate.AuditFilter{Actor: "alice", Limit: 1000})
	require.NoError(t, err)
	require.Len(t, entries, 250, "one audit entry per event, naming the actor")
	_, body = alice.get("/console/audit?actor=alice")
	require.Contains(t, body, "schema deployed")
}

// TestFourEyes: the planner sees no approve button and a forged approve
// from the planner's session is refused by the operation's rule; a second
// admin approves from their own session.
func TestFourEyes(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	delivered := e.insert(t, 3, "delivered", `{"a": 1}`)

	alice := e.signIn(t, "tok-alice")
	form := url.Values{"csrf": {alice.csrf()}, "reason": {"resend after outage"}, "ids": {delivered[0].String() + "\n" + delivered[1].String() + "," + delivered[2].String()}}
	resp, body := alice.post("/console/replays", form)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	plan := resp.Header.Get("Location")

	_, body = alice.get(plan)
	require.Contains(t, body, "you planned it, so you cannot approve it")
	require.NotContains(t, body, `id="approve"`)
	resp, body = alice.post(plan+"/approve", url.Values{"csrf": {alice.csrf()}, "reason": {"self"}})
	require.Equal(t, http.StatusConflict, resp.StatusCode, body)

	bob := e.signIn(t, "tok-bob")
	_, body = bob.get(plan)
	require.Contains(t, body, `id="approve"`)
	resp, _ = bob.post(plan+"/approve", url.Values{"csrf": {bob.csrf()}, "reason": {"checked"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	_, body = alice.get(plan)
	require.Contains(t, body, `<strong id="replay-status">approved</strong>`)
}
