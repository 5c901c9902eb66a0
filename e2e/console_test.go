package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// axeVersion is the axe-core release the console's pages are checked with.
const axeVersion = "4.10.3"

// consoleTokens are the test's operators: two admins (four eyes) and a
// viewer, beside the usual tokens.
const consoleTokens = devTokens + ",dev-ops2=ops2:admin,dev-vera=vera:viewer"

// consoleMailpit is the Mailpit the journey links to (nothing listens
// there: the test checks the links).
const consoleMailpit = "http://127.0.0.1:8025"

// bulkOrders is the size of the failure group resumed from the page.
const bulkOrders = 300

// TestConsoleInABrowser drives the operator console of a real orders serve
// in headless Chromium (Debian's, never a downloaded one), with the
// notifier and the SMTP sink running, over one chain:
//
//   - failure groups: events the relay parks itself under three failures
//     (a schema version it lacks, a record larger than the producer takes,
//     an unknown event type), one group of bulkOrders events; the counts
//     on the page equal the database's; the big group, repaired to the
//     schema version its payloads fit and resumed from its page (the
//     confirm dialogs accepted), drains to zero with an audit entry per
//     event naming the operator;
//   - one email's journey: every hop on the page (outbox row, broker
//     partition and offset, audit, order history, inbox marker, inbox and
//     projection versions, ledger row) equals the databases, and its
//     Message-ID is the one the SMTP sink received, once;
//   - four eyes: a replay planned by one admin shows them no approve
//     button and refuses their forged approve (a fetch with their valid
//     CSRF token); a second admin, in a browser context of their own,
//     approves and runs it to the end; the notifier counts each replayed
//     event as a duplicate and no email is sent twice;
//   - a viewer sees every page and no write control, and a forged write
//     of theirs is refused; a write without the CSRF token is refused; a
//     second orders process with CONSOLE_READ_ONLY=true shows no write
//     control and refuses a write;
//   - a hostile payload shows as text.
//
// Any Content-Security-Policy violation or script error fails it, and so
// does a serious or critical violation axe-core finds on a page. With
// CONSOLE_SCREENSHOTS=dir it saves a screenshot of each page there
// (docs/console/ holds the committed ones).
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	_, err := os.Stat(chromium)
	require.NoError(t, err, "the console test needs Debian's chromium at %s: run scripts/install-chromium.sh (as root; make test and .ci/run do)", chromium)

	notifierAddr := freeAddr(t)
	// A producer limit of 4 KiB: an event larger than that is parked by
	// the relay as message_too_large, as one larger than the broker's
	// message.max.bytes would be.
	consoleEnv := map[string]string{"AUTH_TOKENS": consoleTokens, "CONSOLE_NOTIFIER_URL": "http://" + notifierAddr,
		"CONSOLE_NOTIFIER_TOKEN": "dev-ops", "CONSOLE_MAILPIT_URL": consoleMailpit, "KAFKA_MAX_MESSAGE_BYTES": "4096",
		"CONSOLE_CONSUMER_GROUPS": "notifier-e2e"} // the group c.notifierEnv gives the notifier
	c := newChain(t, consoleEnv)
	delete(consoleEnv, "KAFKA_MAX_MESSAGE_BYTES")
	notifier := start(t, "notifier", c.notifierEnv(map[string]string{"AUTH_TOKENS": consoleTokens, "HTTP_ADDR": notifierAddr}), "serve")
	waitReady(t, notifier, "http://"+notifierAddr+"/readyz")
	began := time.Now().UTC().Add(-time.Minute)
	orderIDs := c.traffic(t)
	ctx := context.Background()
	// Events the relay parks on its own, under three failures, written
	// around the Writer as newer code or a hand would write them: the bulk
	// orders' placements in a schema version this relay lacks (a valid
	// version 1 payload: a repair to version 1 removes the cause), records
	// larger than the producer takes, and events of a type no relay knows,
	// one with a hostile name and payload. Each on an order of its own (a
	// parked event holds back its order's later ones, R6).
	rows, err := c.odb.Pool.Query(ctx, `WITH src AS (SELECT payload FROM outbox WHERE aggregate_id = $1 AND event_type = 'order.placed'),
		ids AS (SELECT i, gen_random_uuid() AS id FROM generate_series(1, $2::int) i)
		INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
		SELECT gen_random_uuid(), 'order', ids.id::text, 1, 'order.placed', 2,
		       jsonb_set(jsonb_set(src.payload, '{order_id}', to_jsonb(ids.id::text)), '{email}', to_jsonb('bulk' || ids.i || '@example.com'))
		FROM src, ids ORDER BY ids.i RETURNING aggregate_id`, orderIDs[1], bulkOrders)
	require.NoError(t, err)
	bulk := make([]string, 0, bulkOrders)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		bulk = append(bulk, id)
	}
	require.NoError(t, rows.Err())
	require.Len(t, bulk, bulkOrders)
	_, err = c.odb.Pool.Exec(ctx, `INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
		SELECT gen_random_uuid(), 'order', gen_random_uuid()::text, 1, 'order.placed', 1,
		       jsonb_build_object('note', repeat('x', 6000 + i))
		FROM generate_series(1, 3) i`)
	require.NoError(t, err)
	_, err = c.odb.Pool.Exec(ctx, `INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
		VALUES (gen_random_uuid(), 'order', gen_random_uuid()::text, 1, 'order.voided', 1, '{"note": "a type of newer code"}'),
		       (gen_random_uuid(), 'order', gen_random_uuid()::text, 1, 'order.<script>alert(1)</script>', 1, '{"note": "<script>alert(2)</script>"}')`)
	require.NoError(t, err)
	parkedByClass := func() map[string]int {
		rows, err := c.odb.Pool.Query(ctx, `SELECT last_error_class, count(*) FROM outbox WHERE state = 'parked' GROUP BY 1`)
		require.NoError(t, err)
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var class string
			var n int
			require.NoError(t, rows.Scan(&class, &n))
			out[class] = n
		}
		require.NoError(t, rows.Err())
		return out
	}
	want := map[string]int{"unknown_schema_version": bulkOrders, "message_too_large": 3, "unknown_event_type": 2}
	waitFor(t, time.Minute, 100*time.Millisecond, "the relay parks the events it cannot publish", func() (bool, string) {
		got := parkedByClass()
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprint(got)
	})
	require.Zero(t, c.undelivered(t)-bulkOrders-5, "every other event is delivered")

	b := newBrowser(t)
	base := "http://" + c.ordersAddr
	a := b.tab(t, base)
	defer a.close()

	a.do(chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("token")))
	a.shot("signin")
	a.axe("signin")
	a.signIn("dev-ops")
	overview := a.text("#main")
	a.shot("overview")
	a.axe("overview")
	require.Contains(t, overview, "order.paid")

	// (a) The groups, counted as the database counts them.
	a.do(chromedp.Navigate(base+"/console/groups"), chromedp.WaitVisible(chromedp.CSS("table")))
	groups := a.text("#main")
	a.shot("groups")
	a.axe("groups")
	require.Contains(t, groups, "event type <v> has no schema version <n> in this relay")
	require.Contains(t, groups, "order.<script>alert(1)</script>", "a hostile event type shown as text")
	onPage := map[string]int{}
	for _, row := range a.strings(`Array.from(document.querySelectorAll("main tbody tr")).map(r => r.cells[2].textContent + "=" + r.cells[4].dataset.count)`) {
		class, n, ok := strings.Cut(row, "=")
		require.True(t, ok, row)
		count, err := strconv.Atoi(n)
		require.NoError(t, err)
		onPage[class] += count
	}
	require.Equal(t, parkedByClass(), onPage, "the groups' counts on the page are the database's")
	tooLarge := a.attr(`//tr[td[text()="message_too_large"]]//a`, "href")

	a.do(chromedp.Click(chromedp.Search(`//tr[td[text()="unknown_schema_version"]]//a`)), chromedp.WaitVisible(chromedp.ID("resume-reason")))
	group := a.text("#main")
	a.shot("group")
	a.axe("group")
	require.Contains(t, group, fmt.Sprintf("This will resume %d events", bulkOrders))
	// The cause removed first: the group repaired to schema version 1,
	// after which its events form the group of repaired events.
	a.do(chromedp.SendKeys(chromedp.ID("repair-version"), "1"), chromedp.SendKeys(chromedp.ID("repair-reason"), "written by newer code: version 1 payload"),
		chromedp.Click(chromedp.Search(`//button[starts-with(text(), "Repair")]`)), chromedp.WaitVisible(chromedp.CSS("#job-state[data-finished]")))
	require.Contains(t, a.text("#main"), fmt.Sprintf("%d of %d done", bulkOrders, bulkOrders))
	require.Equal(t, bulkOrders, parkedByClass()["repaired"])
	a.do(chromedp.Navigate(base+"/console/groups"), chromedp.WaitVisible(chromedp.CSS("table")),
		chromedp.Click(chromedp.Search(`//tr[td[text()="repaired"]]//a`)), chromedp.WaitVisible(chromedp.ID("resume-reason")))
	require.Contains(t, a.text("#main"), fmt.Sprintf("This will resume %d events", bulkOrders))
	a.do(chromedp.SendKeys(chromedp.ID("resume-reason"), "schema v2 rows repaired to v1"), chromedp.Click(chromedp.ID("resume-group")),
		chromedp.WaitVisible(chromedp.CSS("#job-state[data-finished]")))
	job := a.text("#main")
	a.shot("job")
	a.axe("job")
	require.Contains(t, job, fmt.Sprintf("%d of %d done", bulkOrders, bulkOrders))
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, c.odb.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE aggregate_id = ANY($1::text[]) AND state <> 'delivered'`, bulk).Scan(&n))
		return n == 0
	}, time.Minute, 100*time.Millisecond, "the group drains: the relay delivers the resumed events")
	require.NotContains(t, parkedByClass(), "unknown_schema_version")
	require.NotContains(t, parkedByClass(), "repaired")
	var audited int
	require.NoError(t, c.odb.Pool.QueryRow(ctx, `SELECT count(DISTINCT target) FROM outbox_audit WHERE actor = 'ops' AND action = 'resume'`).Scan(&audited))
	require.Equal(t, bulkOrders, audited, "one audit entry per event, naming the operator")
	a.do(chromedp.Navigate(base+"/console/groups"), chromedp.WaitVisible(chromedp.CSS("table")))
	require.NotContains(t, a.text("#main"), "unknown_schema_version", "the group is gone from the page")
	require.NotContains(t, a.text("#main"), "repaired")

	// (b) One email's journey: a resumed event, delivered twice, applied
	// once by the notifier, its email sent once.
	var eventID, messageID, smtpReply string
	var partition, offset, inboxVersion, projectionVersion int64
	require.NoError(t, c.odb.Pool.QueryRow(ctx, `SELECT event_id::text, broker_partition, broker_offset FROM outbox
		WHERE aggregate_id = $1`, bulk[0]).Scan(&eventID, &partition, &offset))
	waitFor(t, time.Minute, 100*time.Millisecond, "the notifier sends the journey's email", func() (bool, string) {
		err := c.ndb.Pool.QueryRow(ctx, `SELECT message_id, coalesce(smtp_reply, '') FROM email_send WHERE event_id = $1 AND state = 'sent'`,
			eventID).Scan(&messageID, &smtpReply)
		return err == nil && c.smtp.Count(messageID) == 1, fmt.Sprint(err)
	})
	require.NoError(t, c.ndb.Pool.QueryRow(ctx, `SELECT last_version FROM inbox_aggregate WHERE aggregate_type = 'order' AND aggregate_id = $1`,
		bulk[0]).Scan(&inboxVersion))
	require.NoError(t, c.ndb.Pool.QueryRow(ctx, `SELECT version FROM order_projection WHERE order_id = $1`, bulk[0]).Scan(&projectionVersion))
	var received []string
	for _, m := range c.smtp.Accepted() {
		if m.MessageID == messageID {
			received = append(received, m.MessageID)
		}
	}
	require.Equal(t, []string{messageID}, received, "the SMTP sink received the ledger's Message-ID once")

	a.do(chromedp.Navigate(base+"/console/events/"+eventID), chromedp.WaitVisible(chromedp.ID("ledger")))
	a.shot("event")
	a.axe("event")
	require.True(t, strings.HasPrefix(a.text("#event-state"), "delivered"))
	require.Equal(t, strconv.FormatInt(partition, 10), a.text("#broker-partition"))
	require.Equal(t, strconv.FormatInt(offset, 10), a.text("#broker-offset"))
	audit := a.text(`section[aria-labelledby="audit"]`)
	require.Contains(t, audit, "ops")
	require.Contains(t, audit, "schema v2 rows repaired to v1")
	require.Contains(t, audit, "written by newer code: version 1 payload")
	require.Contains(t, a.text(`section[aria-labelledby="history"] tr.current`), "order.placed")
	require.Equal(t, "applied (version 1)", a.text("#inbox-outcome"))
	require.NotEqual(t, "-", a.text("#inbox-received"))
	require.Equal(t, strconv.FormatInt(inboxVersion, 10), a.text("#inbox-version"))
	require.Equal(t, strconv.FormatInt(projectionVersion, 10), a.text("#projection-version"))
	require.Equal(t, messageID, a.text(`tr[data-this-event] .message-id`), "the page's Message-ID is the ledger's and the sink's")
	require.Equal(t, "sent", a.text(`tr[data-this-event] .ledger-state`))
	require.Equal(t, smtpReply, a.text(`tr[data-this-event] .smtp-reply`))
	require.Equal(t, consoleMailpit+"/search?q="+url.QueryEscape("message-id:"+strings.Trim(messageID, "<>")),
		a.attr(`//tr[@data-this-event]//a[text()="in Mailpit"]`, "href"))
	require.Equal(t, consoleMailpit+"/search?q="+bulk[0], a.attr(`//a[text()="Search Mailpit for this order's emails"]`, "href"))

	// (c) Four eyes: ops plans, ops2 approves and runs.
	duplicatesBefore := a.metric("http://"+notifierAddr+"/metrics", "inbox_duplicates_total", `event_type="order.cancelled"`)
	a.do(chromedp.Navigate(base+"/console/replays"), chromedp.WaitVisible(chromedp.ID("plan-reason")))
	a.shot("replays")
	a.axe("replays")
	a.do(chromedp.SendKeys(chromedp.ID("from"), began.Format("2006-01-02T15:04")),
		chromedp.SendKeys(chromedp.ID("to"), time.Now().UTC().Add(2*time.Minute).Format("2006-01-02T15:04")),
		chromedp.SendKeys(chromedp.ID("type"), "order.cancelled"), chromedp.SendKeys(chromedp.ID("plan-reason"), "resend after the outage"),
		chromedp.Submit(chromedp.ID("plan-reason")), chromedp.WaitVisible(chromedp.ID("planned-by")))
	planURL := a.eval(`location.pathname`)
	a.shot("replay")
	a.axe("replay")
	require.Equal(t, 0, a.count("#approve"), "the planner's session has no approve button")
	require.Contains(t, a.text("#no-approve"), "you planned it, so you cannot approve it")
	require.Equal(t, 409, a.post(planURL+"/approve", true), "a forged approve from the planner's session is refused")
	planID := strings.TrimPrefix(planURL, "/console/replays/")
	var status string
	require.NoError(t, c.odb.Pool.QueryRow(ctx, `SELECT status FROM outbox_replay_plan WHERE id = $1`, planID).Scan(&status))
	require.Equal(t, "planned", status)

	a2 := b.tab(t, base)
	defer a2.close()
	a2.do(chromedp.Navigate(base+planURL), chromedp.WaitVisible(chromedp.ID("token")))
	a2.signIn("dev-ops2")
	a2.do(chromedp.WaitVisible(chromedp.ID("approve")), chromedp.SendKeys(chromedp.ID("approve-reason"), "checked the range"),
		chromedp.Click(chromedp.ID("approve")), chromedp.WaitVisible(chromedp.ID("run")))
	a2.do(chromedp.SendKeys(chromedp.ID("run-reason"), "go"), chromedp.Click(chromedp.ID("run")),
		chromedp.WaitVisible(chromedp.CSS("#replay-status[data-finished]")))
	require.Equal(t, "done", a2.text("#replay-status"))
	published, err := strconv.Atoi(a2.text("#replay-published"))
	require.NoError(t, err)
	require.Equal(t, 1, published, "the one cancellation is published again")
	require.NoError(t, c.odb.Pool.QueryRow(ctx, `SELECT status FROM outbox_replay_plan WHERE id = $1`, planID).Scan(&status))
	require.Equal(t, "done", status)
	waitFor(t, time.Minute, 100*time.Millisecond, "the notifier counts the replayed event as a duplicate", func() (bool, string) {
		n := a.metric("http://"+notifierAddr+"/metrics", "inbox_duplicates_total", `event_type="order.cancelled"`)
		return n-duplicatesBefore == float64(published), fmt.Sprintf("duplicates %v, before %v", n, duplicatesBefore)
	})
	sent := map[string]int{}
	for _, m := range c.smtp.Accepted() {
		sent[m.MessageID]++
		require.Equal(t, 1, sent[m.MessageID], "no email twice: %s", m.MessageID)
	}

	// (d) A viewer sees every page and no write control; their forged
	// write is refused, and so is a write without the CSRF token.
	v := b.tab(t, base)
	defer v.close()
	v.do(chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("token")))
	v.signIn("dev-vera")
	pages := []string{"/console/overview", "/console/groups", tooLarge, "/console/events/" + eventID, "/console/orders/" + bulk[0],
		"/console/replays", planURL, "/console/notifier", "/console/audit"}
	for _, p := range pages {
		v.noWriteControl(base + p)
	}
	require.Equal(t, 403, v.post(tooLarge+"/resume", true), "a viewer's forged write is refused")
	require.Equal(t, 403, a.post(tooLarge+"/resume", false), "a write without the CSRF token is refused")
	require.Equal(t, 3, parkedByClass()["message_too_large"], "the refused writes changed nothing")

	// A second orders process, read only, on the same database.
	roAddr := freeAddr(t)
	roEnv := ordersEnv(c.odb, roAddr, c.broker)
	for k, val := range consoleEnv {
		roEnv[k] = val
	}
	roEnv["CONSOLE_READ_ONLY"], roEnv["RELAY_ENABLED"] = "true", "false"
	ro := start(t, "orders", roEnv, "serve")
	roBase := "http://" + roAddr
	waitReady(t, ro, roBase+"/readyz")
	r := b.tab(t, roBase)
	defer r.close()
	r.do(chromedp.Navigate(roBase+"/console/"), chromedp.WaitVisible(chromedp.ID("token")))
	r.signIn("dev-ops")
	require.Contains(t, r.text(".banner"), "Read only")
	for _, p := range pages {
		r.noWriteControl(roBase + p)
	}
	require.Equal(t, 403, r.post(tooLarge+"/resume", true), "the read-only console refuses an admin's write")
	require.Equal(t, 3, parkedByClass()["message_too_large"])

	// The hostile payload shows as text.
	var hostile string
	require.NoError(t, c.odb.Pool.QueryRow(ctx, `SELECT event_id::text FROM outbox WHERE event_type LIKE '%<script>%'`).Scan(&hostile))
	a.do(chromedp.Navigate(base+"/console/events/"+hostile), chromedp.WaitVisible(chromedp.ID("payload")))
	a.axe("event (hostile)")
	require.Contains(t, a.text("#payload"), `"note": "<script>alert(2)</script>"`, "the payload shows as text")
	require.Equal(t, 1, a.count("script"), "only the console's own script is on the page")
	a.do(chromedp.Navigate(base+"/console/notifier"), chromedp.WaitVisible(chromedp.ID("main")))
	a.shot("notifier")
	a.axe("notifier")
	a.do(chromedp.Navigate(base+"/console/audit?actor=ops"), chromedp.WaitVisible(chromedp.ID("actor")))
	a.shot("audit")
	a.axe("audit")

	b.noProblems(t)
}

// browser is one headless Chromium; each tab has a browser context (its
// own cookies) and its script errors and CSP violations are collected.
type browser struct {
	ctx      context.Context
	axeJS    []byte
	shots    string
	mu       sync.Mutex
	problems []string
	// forged counts the forged POSTs sent to each URL: the browser logs
	// each refusal as a failed load, which is the expected outcome there.
	forged map[string]int
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	alloc, cancel := chromedp.NewExecAllocator(context.Background(), chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.Flag("disable-background-networking", true), chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()))
	t.Cleanup(cancel)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(cancel)
	ctx, cancel = context.WithTimeout(ctx, 4*time.Minute)
	t.Cleanup(cancel)
	// The browser starts with its first run.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")))
	// axe-core, pinned, from npm (scripts/install-axe.sh; make test-tools
	// installs it first), injected into each page through DevTools.
	out, err := exec.Command("../scripts/install-axe.sh", axeVersion).Output()
	require.NoError(t, err, "install axe-core %s with scripts/install-axe.sh (npm)", axeVersion)
	axeJS, err := os.ReadFile(strings.TrimSpace(string(out)))
	require.NoError(t, err)
	return &browser{ctx: ctx, axeJS: axeJS, shots: os.Getenv("CONSOLE_SCREENSHOTS"), forged: map[string]int{}}
}

func (b *browser) noProblems(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Empty(t, b.problems, "no CSP violation or script error in the console: %s", strings.Join(b.problems, "; "))
}

// tab is one operator's browser session on a console at base.
type tab struct {
	t      *testing.T
	b      *browser
	ctx    context.Context
	cancel context.CancelFunc
	base   string
}

func (b *browser) tab(t *testing.T, base string) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.ctx, chromedp.WithNewBrowserContext())
	tb := &tab{t: t, b: b, ctx: ctx, cancel: cancel, base: base}
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch e := ev.(type) {
		case *log.EventEntryAdded:
			if e.Entry.Level == log.EntryLevelError && strings.HasPrefix(e.Entry.Text, "Failed to load resource") && b.forged[e.Entry.URL] > 0 {
				b.forged[e.Entry.URL]--
			} else if e.Entry.Level == log.EntryLevelError {
				b.problems = append(b.problems, e.Entry.Text)
			}
		case *runtime.EventExceptionThrown:
			b.problems = append(b.problems, e.ExceptionDetails.Text)
		}
	}))
	_, err := chromedp.Call(ctx, log.Enable, cdp.Empty{})
	require.NoError(t, err)
	// The confirm of a write: accept it, as the operator would.
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for _, err := range dialogs {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	return tb
}

func (tb *tab) close() { tb.cancel() }

func (tb *tab) do(steps ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	require.NoError(tb.t, chromedp.Do(tb.ctx, steps...))
}

func (tb *tab) signIn(token string) {
	tb.t.Helper()
	tb.do(chromedp.SendKeys(chromedp.ID("token"), token), chromedp.Submit(chromedp.ID("token")), chromedp.WaitVisible(chromedp.ID("main")),
		chromedp.WaitNotPresent(chromedp.ID("token")))
}

func (tb *tab) text(sel string) string {
	tb.t.Helper()
	s, err := chromedp.Run(tb.ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(tb.t, err)
	return strings.TrimSpace(s)
}

func (tb *tab) attr(xpath, name string) string {
	tb.t.Helper()
	a, err := chromedp.Run(tb.ctx, chromedp.AttributeValue(chromedp.Search(xpath), name))
	require.NoError(tb.t, err)
	require.True(tb.t, a.Exists, "%s has no %s", xpath, name)
	return a.Value
}

func (tb *tab) eval(js string) string {
	tb.t.Helper()
	s, err := chromedp.Run(tb.ctx, chromedp.Evaluate[string](js))
	require.NoError(tb.t, err)
	return s
}

func (tb *tab) strings(js string) []string {
	tb.t.Helper()
	s, err := chromedp.Run(tb.ctx, chromedp.Evaluate[[]string](js))
	require.NoError(tb.t, err)
	return s
}

func (tb *tab) count(sel string) int {
	tb.t.Helper()
	n, err := chromedp.Run(tb.ctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
	require.NoError(tb.t, err)
	return n
}

// post sends a forged POST from the page, as a script running in the
// operator's session would: with the page's CSRF token when withCSRF, and
// a reason. It returns the status; a redirect (the write went through)
// shows as 0.
func (tb *tab) post(path string, withCSRF bool) int {
	tb.t.Helper()
	js := fmt.Sprintf(`(async () => {
		const form = new URLSearchParams({reason: "forged"});
		if (%t) form.set("csrf", document.querySelector("input[name=csrf]").value);
		const r = await fetch(%q, {method: "POST", body: form, redirect: "manual"});
		return r.status;
	})()`, withCSRF, path)
	tb.b.mu.Lock()
	tb.b.forged[tb.base+path]++
	tb.b.mu.Unlock()
	n, err := chromedp.Run(tb.ctx, chromedp.Evaluate[int](js, chromedp.EvalAwaitPromise))
	require.NoError(tb.t, err)
	return n
}

// noWriteControl opens url and checks that it shows no form that writes
// (the sign-out form aside).
func (tb *tab) noWriteControl(url string) {
	tb.t.Helper()
	tb.do(chromedp.Navigate(url), chromedp.WaitVisible(chromedp.ID("main")))
	require.Equal(tb.t, 0, tb.count(`main form[method="post"]`), "a write control on %s", url)
	require.Equal(tb.t, 0, tb.count("#approve, #run, #resume-group"), "a write button on %s", url)
	require.NotRegexp(tb.t, `^\d{3} `, tb.text("h1"), "an error page at %s", url)
}

func (tb *tab) metric(url, name string, labels ...string) float64 {
	tb.t.Helper()
	v, err := scrapeMetric(url, name, labels...)
	require.NoError(tb.t, err)
	return v
}

func (tb *tab) shot(name string) {
	tb.t.Helper()
	if tb.b.shots == "" {
		return
	}
	// A page longer than three screens (a group of hundreds of events,
	// their audit entries) is shot as its first screen.
	action := chromedp.FullScreenshot(100)
	if tb.count("main tr") > 60 {
		action = chromedp.CaptureScreenshot()
	}
	buf, err := chromedp.Run(tb.ctx, action)
	require.NoError(tb.t, err)
	require.NoError(tb.t, os.WriteFile(filepath.Join(tb.b.shots, name+".png"), buf, 0o644))
}

func (tb *tab) axe(name string) {
	tb.t.Helper()
	_, err := chromedp.Run(tb.ctx, chromedp.Evaluate[bool](string(tb.b.axeJS)+";true"))
	require.NoError(tb.t, err)
	bad, err := chromedp.Run(tb.ctx, chromedp.Evaluate[[]string](`axe.run(document).then(r => r.violations
		.filter(v => v.impact === "serious" || v.impact === "critical")
		.map(v => v.id + " (" + v.impact + ", " + v.nodes.length + " nodes): " + v.help))`, chromedp.EvalAwaitPromise))
	require.NoError(tb.t, err)
	require.Empty(tb.t, bad, "axe-core on the %s page", name)
}
