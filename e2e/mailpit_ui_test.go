package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/composetest"
)

// chromium is Debian's package, which scripts/install-chromium.sh installs
// (make test and .ci/run call it). The test never downloads a browser.
const chromium = "/usr/bin/chromium"

// TestDemoMailpitShowsTheNotifiersEmail runs the Mailpit that `make demo`
// runs (scripts/build-mailpit.sh, the version of scripts/demo.env) behind
// the real chain, orders to relay to notifier to SMTP, and loads Mailpit's
// web UI in headless Chromium until the order's email is listed. A Mailpit
// built by `go install` lacks the UI's compiled JavaScript and CSS: its
// page stays blank and this test fails. The message list is rendered by
// that JavaScript, so only a browser sees it; the page's HTML as served
// does not contain the subject (checked below).
func TestDemoMailpitShowsTheNotifiersEmail(t *testing.T) {
	t.Parallel()
	_, err := os.Stat(chromium)
	require.NoError(t, err, "the web UI test needs Debian's chromium at %s: run scripts/install-chromium.sh (as root; make test and .ci/run do)", chromium)

	mailpit := buildMailpit(t)
	smtpAddr, uiAddr := freeAddr(t), freeAddr(t)
	mp := start(t, mailpit, nil, "--smtp", smtpAddr, "--listen", uiAddr,
		"--database", filepath.Join(t.TempDir(), "mailpit.db"), "--disable-version-check")
	ui := "http://" + uiAddr
	waitReady(t, mp, ui+"/readyz")

	c := newChain(t)
	notifier := start(t, "notifier", c.notifierEnv(map[string]string{"SMTP_ADDR": smtpAddr}), "serve")
	waitReady(t, notifier, "http://"+c.notifierAddr+"/readyz")

	recipient := "ui-" + uuid.NewString()[:8] + "@example.com"
	status, body, err := c.client.call("POST", "/orders", "", newOrder(recipient))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	orderID := body["id"].(string)

	// The subject the notifier gave the email, as Mailpit's API reports it.
	var subject string
	require.Eventually(t, func() bool {
		subject = mailpitSubject(t, ui, recipient)
		return subject != ""
	}, 30*time.Second, 100*time.Millisecond, "Mailpit received no email for %s", recipient)
	require.Contains(t, subject, orderID[:8], "the email of order %s", orderID)

	served := httpGet(t, ui+"/")
	require.NotContains(t, served, subject, "the page as served lists no message; its JavaScript does")

	profile := t.TempDir()
	var dom string
	require.Eventually(t, func() bool {
		dom = runChromium(t, profile, "--dump-dom", ui+"/")
		return strings.Contains(dom, subject)
	}, 60*time.Second, time.Second, "Mailpit's web UI in Chromium never listed %q; is its UI built? (dist assets: %s)",
		subject, distStatus(t, ui))
	require.Contains(t, dom, recipient)

	shot := filepath.Join(t.TempDir(), "mailpit.png")
	runChromium(t, profile, "--window-size=1280,800", "--hide-scrollbars", "--screenshot="+shot, ui+"/")
	info, err := os.Stat(shot)
	require.NoError(t, err, "Chromium took no screenshot")
	require.NotZero(t, info.Size())
	t.Logf("Mailpit's web UI listing %q: screenshot %s", subject, shot)
}

// buildMailpit returns the demo's Mailpit, built (once, then cached in
// .demo/bin) by the same script as `make demo` uses.
func buildMailpit(t *testing.T) string {
	t.Helper()
	root := composetest.Root(t)
	version := composetest.DemoEnv(t)["MAILPIT_VERSION"]
	require.NotEmpty(t, version, "scripts/demo.env has no MAILPIT_VERSION")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "build-mailpit.sh"), version)
	cmd.Dir = root
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "scripts/build-mailpit.sh %s:\n%s", version, stderr.String())
	return strings.TrimSpace(string(out))
}

// runChromium runs headless Chromium once on a page and returns what it
// printed (the DOM with --dump-dom). The virtual time budget lets the page's
// scripts fetch and render before Chromium dumps or shoots it.
func runChromium(t *testing.T, profile string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// No connections of Chromium's own (updates, sync, QUIC probes): the
	// test needs only the local page, and CI machines have no outside network.
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run",
		"--user-data-dir=" + profile, "--virtual-time-budget=5000"}, args...)
	cmd := exec.CommandContext(ctx, chromium, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "chromium %s:\n%s", strings.Join(args, " "), tail(stderr.String(), 4000))
	return string(out)
}

// mailpitSubject returns the subject of the message Mailpit holds for
// recipient, or "" while there is none.
func mailpitSubject(t *testing.T, ui, recipient string) string {
	t.Helper()
	var list struct {
		Messages []struct {
			Subject string
			To      []struct{ Address string }
		} `json:"messages"`
	}
	require.NoError(t, json.Unmarshal([]byte(httpGet(t, ui+"/api/v1/messages")), &list))
	for _, m := range list.Messages {
		for _, to := range m.To {
			if to.Address == recipient {
				return m.Subject
			}
		}
	}
	return ""
}

// distStatus reports what the UI's compiled assets answer, for the failure
// message: 404 means a Mailpit built without them.
func distStatus(t *testing.T, ui string) string {
	t.Helper()
	var s []string
	for _, asset := range []string{"/dist/app.js", "/dist/app.css"} {
		res, err := http.Get(ui + asset)
		if err != nil {
			s = append(s, fmt.Sprintf("%s: %v", asset, err))
			continue
		}
		res.Body.Close()
		s = append(s, fmt.Sprintf("%s %d", asset, res.StatusCode))
	}
	return strings.Join(s, ", ")
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	res, err := http.Get(url)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, "GET %s: %s", url, b)
	return string(b)
}
