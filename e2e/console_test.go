package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
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

// TestConsoleInABrowser drives the operator console of a real orders serve
// in headless Chromium (Debian's, never a downloaded one): sign in, the
// overview, a failure group resumed as a whole from its page (the confirm
// dialog accepted), drained to zero with an audit entry per event naming
// the operator, and the event's journey with a hostile payload shown as
// text. Any Content-Security-Policy violation or script error fails it,
// and so does a serious or critical violation axe-core finds on a page.
// With CONSOLE_SCREENSHOTS=dir it saves a screenshot of each page there
// (docs/console/ holds the committed ones).
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	_, err := os.Stat(chromium)
	require.NoError(t, err, "the console test needs Debian's chromium at %s: run scripts/install-chromium.sh (as root; make test and .ci/run do)", chromium)

	c := newChain(t)
	orderIDs := c.traffic(t)
	ctx := context.Background()
	// Park the delivered events as the relay parks a failure (a shortcut:
	// the relay's own parking is tested in internal/outbox/relay): two
	// kinds, one with a hostile error text.
	_, err = c.odb.Pool.Exec(ctx, `UPDATE outbox SET state = 'parked', attempts = 5, last_error_class = 'unknown_schema_version',
		last_error = 'event ' || event_id || ': schema version ' || aggregate_version || ' is not registered'
		WHERE event_type = 'order.paid'`)
	require.NoError(t, err)
	_, err = c.odb.Pool.Exec(ctx, `UPDATE outbox SET state = 'parked', attempts = 5, last_error_class = 'invalid',
		last_error = '<script>alert(1)</script>', payload = '{"note": "<script>alert(2)</script>"}'::jsonb
		WHERE aggregate_id = $1 AND event_type = 'order.placed'`, orderIDs[0])
	require.NoError(t, err)
	var paidParked int
	require.NoError(t, c.odb.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE state = 'parked' AND event_type = 'order.paid'`).Scan(&paidParked))
	require.Equal(t, 3, paidParked)

	alloc, cancel := chromedp.NewExecAllocator(ctx, chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.Flag("disable-background-networking", true), chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()))
	defer cancel()
	bctx, cancel := chromedp.NewContext(alloc)
	defer cancel()
	bctx, cancel = context.WithTimeout(bctx, 2*time.Minute)
	defer cancel()

	var mu sync.Mutex
	var problems []string
	require.NoError(t, chromedp.Listen(bctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *log.EventEntryAdded:
			if e.Entry.Level == log.EntryLevelError {
				problems = append(problems, e.Entry.Text)
			}
		case *runtime.EventExceptionThrown:
			problems = append(problems, e.ExceptionDetails.Text)
		}
	}))
	// The confirm of a bulk action: accept it, as the operator would.
	dialogs := chromedp.Events(bctx, page.JavascriptDialogOpening)
	go func() {
		for _, err := range dialogs {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(bctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	base := "http://" + c.ordersAddr
	shots := os.Getenv("CONSOLE_SCREENSHOTS")
	shot := func(name string) {
		t.Helper()
		if shots == "" {
			return
		}
		buf, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(shots, name+".png"), buf, 0o644))
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err)
		return s
	}
	do := func(steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx, steps...))
	}

	// axe-core, pinned, from npm (scripts/install-axe.sh; make test-tools
	// installs it first), injected into each page through DevTools.
	out, err := exec.Command("../scripts/install-axe.sh", axeVersion).Output()
	require.NoError(t, err, "install axe-core %s with scripts/install-axe.sh (npm)", axeVersion)
	axeJS, err := os.ReadFile(strings.TrimSpace(string(out)))
	require.NoError(t, err)
	axe := func(name string) {
		t.Helper()
		_, err := chromedp.Run(bctx, chromedp.Evaluate[bool](string(axeJS)+";true"))
		require.NoError(t, err)
		bad, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`axe.run(document).then(r => r.violations
			.filter(v => v.impact === "serious" || v.impact === "critical")
			.map(v => v.id + " (" + v.impact + ", " + v.nodes.length + " nodes): " + v.help))`, chromedp.EvalAwaitPromise))
		require.NoError(t, err)
		require.Empty(t, bad, "axe-core on the %s page", name)
	}

	_, err = chromedp.Call(bctx, log.Enable, cdp.Empty{})
	require.NoError(t, err)
	do(chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("token")))
	shot("signin")
	axe("signin")
	do(chromedp.SendKeys(chromedp.ID("token"), "dev-ops"), chromedp.Submit(chromedp.ID("token")),
		chromedp.WaitVisible(chromedp.ID("overview")))
	overview := text("#main")
	shot("overview")
	axe("overview")
	require.Contains(t, overview, "order.paid")

	do(chromedp.Navigate(base+"/console/groups"), chromedp.WaitVisible(chromedp.CSS("table")))
	groups := text("#main")
	shot("groups")
	axe("groups")
	require.Contains(t, groups, "event <id>: schema version <n> is not registered")
	require.Contains(t, groups, "<script>alert(<n>)</script>", "hostile text shown as text")

	do(chromedp.Click(chromedp.Search(`//tr[td[text()="unknown_schema_version"]]//a`)), chromedp.WaitVisible(chromedp.ID("resume-reason")))
	group := text("#main")
	shot("group")
	axe("group")
	require.Contains(t, group, "This will resume 3 events")
	do(chromedp.SendKeys(chromedp.ID("resume-reason"), "schema v2 deployed"), chromedp.Click(chromedp.ID("resume-group")),
		chromedp.WaitVisible(chromedp.CSS("#job-state[data-finished]")))
	job := text("#main")
	shot("job")
	axe("job")
	require.Contains(t, job, "3 of 3 done")

	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, c.odb.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE event_type = 'order.paid' AND state <> 'delivered'
			AND aggregate_id <> $1`, orderIDs[0]).Scan(&n))
		return n == 0
	}, 30*time.Second, 100*time.Millisecond, "the group drains: the relay delivers the resumed events")
	var held string
	require.NoError(t, c.odb.Pool.QueryRow(ctx, `SELECT state FROM outbox WHERE event_type = 'order.paid' AND aggregate_id = $1`, orderIDs[0]).Scan(&held))
	require.Equal(t, "pending", held, "resumed, and held behind its order's parked first event (strict order)")
	var audited int
	require.NoError(t, c.odb.Pool.QueryRow(ctx, `SELECT count(DISTINCT target) FROM outbox_audit WHERE actor = 'ops' AND action = 'resume'`).Scan(&audited))
	require.Equal(t, paidParked, audited, "one audit entry per event, naming the operator")

	var hostile string
	require.NoError(t, c.odb.Pool.QueryRow(ctx, `SELECT event_id::text FROM outbox WHERE state = 'parked'`).Scan(&hostile))
	do(chromedp.Navigate(base+"/console/events/"+hostile), chromedp.WaitVisible(chromedp.ID("payload")))
	event := text("#payload")
	shot("event")
	axe("event")
	scripts, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("script").length`))
	require.NoError(t, err)
	require.Contains(t, event, `"note": "<script>alert(2)</script>"`, "the payload shows as text")
	require.Equal(t, 1, scripts, "only the console's own script is on the page")
	do(chromedp.Navigate(base+"/console/audit?actor=ops"), chromedp.WaitVisible(chromedp.ID("actor")))
	shot("audit")
	axe("audit")
	do(chromedp.Navigate(base+"/console/replays"), chromedp.WaitVisible(chromedp.ID("plan-reason")))
	shot("replays")
	axe("replays")

	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, problems, "no CSP violation or script error in the console: %s", strings.Join(problems, "; "))
}
