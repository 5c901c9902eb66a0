package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/pgtest"
)

// TestAdminCLI runs `orders admin` against a live `orders serve` (O4, O5,
// S1): an event the relay parks shows in `parked`; `repair` then `resume`
// deliver it with the same event_id; the audit names the actor. A replay
// plan publishes nothing; a time-range plan runs only after a second admin
// approves it; the run republishes the original event. Customers get 403.
func TestAdminCLI(t *testing.T) {
	t.Parallel()
	db, base, admin := startAdminServe(t)
	ctx := context.Background()

	// An event written by code newer than this relay: schema version 2.
	id := uuid.New()
	order := uuid.New()
	_, err := db.Pool.Exec(ctx, `INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
		VALUES ($1, 'order', $2, 1, 'order.placed', 2, '{"order_id": "x"}')`, id, order.String())
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		out, err := admin("ops-token", "parked")
		return err == nil && strings.Contains(out, id.String())
	}, 20*time.Second, 100*time.Millisecond, "the parked event is listed")
	out, err := admin("ops-token", "parked", "--type", "order.placed")
	require.NoError(t, err)
	require.Regexp(t, id.String()+`\s+order.placed\s+`+order.String()+`\s+1\s+\d+\s+unknown_schema_version`, out)

	_, err = admin("alice-token", "parked")
	require.ErrorContains(t, err, "403", "the admin API needs the admin role")

	payload := filepath.Join(t.TempDir(), "payload.json")
	require.NoError(t, os.WriteFile(payload, fmt.Appendf(nil, `{"order_id": %q, "customer": "alice", "email": "alice@example.com",
		"currency": "EUR", "items": [{"sku": "BOOK-1", "quantity": 1, "unit_price_cents": 100}], "total_cents": 100,
		"placed_at": "2026-01-01T00:00:00Z"}`, order), 0o600))
	_, err = admin("ops-token", "repair", id.String(), "--schema-version", "1")
	require.ErrorContains(t, err, "400", "a reason is required")
	_, err = admin("ops-token", "repair", id.String(), "--schema-version", "1", "--reason", "new code rolled back")
	require.ErrorContains(t, err, "400", "the v2 payload fails the v1 schema: nothing written")
	require.ErrorContains(t, err, "repair refused")
	// The order events' own check (orders.CheckRepair): the payload must
	// be this order's, its address one plain address.
	for name, tc := range map[string]struct{ orderID, email, want string }{
		"another order": {uuid.NewString(), "alice@example.com", "payload order_id must be the event's own order, " + order.String()},
		"CR/LF":         {order.String(), "alice@example.com\r\nBcc: eve@example.com", "payload email must be one plain address"},
		"display name":  {order.String(), "Alice <alice@example.com>", "payload email must be one plain address"},
	} {
		bad := filepath.Join(t.TempDir(), "bad.json")
		require.NoError(t, os.WriteFile(bad, fmt.Appendf(nil, `{"order_id": %q, "customer": "alice", "email": %q,
			"currency": "EUR", "items": [{"sku": "BOOK-1", "quantity": 1, "unit_price_cents": 100}], "total_cents": 100,
			"placed_at": "2026-01-01T00:00:00Z"}`, tc.orderID, tc.email), 0o600))
		_, err = admin("ops-token", "repair", id.String(), "--payload", bad, "--schema-version", "1", "--reason", "fix")
		require.ErrorContains(t, err, "400", name)
		require.ErrorContains(t, err, tc.want, name)
	}
	var audited int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox_audit WHERE target = $1", id.String()).Scan(&audited))
	require.Zero(t, audited, "a refused repair writes and audits nothing")
	out, err = admin("ops-token", "repair", id.String(), "--payload", payload, "--schema-version", "1", "--reason", "new code rolled back")
	require.NoError(t, err, out)
	out, err = admin("ops2-token", "resume", id.String(), "--reason", "repaired")
	require.NoError(t, err, out)
	require.Contains(t, out, "resumed 1 events")
	require.Eventually(t, func() bool {
		var state string
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT state FROM outbox WHERE event_id = $1", id).Scan(&state))
		return state == "delivered"
	}, 20*time.Second, 50*time.Millisecond, "delivered with the same event_id")

	out, err = admin("ops-token", "show", id.String())
	require.NoError(t, err)
	require.Regexp(t, `state\s+delivered`, out)
	require.Regexp(t, `ops\s+repair\s+new code rolled back`, out)
	require.Regexp(t, `ops2\s+resume\s+repaired`, out)

	// A plan by id publishes nothing and says who is reached.
	out, err = admin("ops-token", "replay", "plan", "--ids", id.String(), "--reason", "a consumer lost its state")
	require.NoError(t, err, out)
	require.Contains(t, out, "consumer notifier: sees 1 events, inbox retention 720h0m0s")
	require.Contains(t, out, `side effect of order.placed: email to the customer ("order received")`)
	planID := regexp.MustCompile(`plan (\S+): planned`).FindStringSubmatch(out)[1]

	// A time-range plan waits for a second admin.
	out, err = admin("ops-token", "replay", "plan", "--from", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339),
		"--to", time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "--reason", "rebuild a read model", "--json")
	require.NoError(t, err, out)
	var rangePlan struct {
		ID            string `json:"id"`
		NeedsApproval bool   `json:"needs_approval"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rangePlan))
	require.True(t, rangePlan.NeedsApproval)
	_, err = admin("ops-token", "replay", "run", rangePlan.ID, "--reason", "go")
	require.ErrorContains(t, err, "409")
	_, err = admin("ops-token", "replay", "approve", rangePlan.ID, "--reason", "mine")
	require.ErrorContains(t, err, "409", "not by the admin who planned it")
	out, err = admin("ops2-token", "replay", "approve", rangePlan.ID, "--reason", "checked")
	require.NoError(t, err, out)
	require.Contains(t, out, "approved by ops2")

	for _, p := range []string{planID, rangePlan.ID} {
		out, err = admin("ops-token", "replay", "run", p, "--reason", "go", "--wait")
		require.NoError(t, err, out)
		require.Contains(t, out, ": done")
	}
	out, err = admin("ops-token", "show", id.String())
	require.NoError(t, err)
	require.Equal(t, 2, strings.Count(out, "published"), "both replays are in the event's history:\n%s", out)

	// The publish-mode migration (O7): order.placed goes to shadow mode, an
	// order is placed, the direct path sends its event from the request,
	// the relay compares and finds the same record.
	out, err = admin("ops-token", "publish-mode")
	require.NoError(t, err)
	require.Regexp(t, `order.placed\s+outbox`, out)
	_, err = admin("ops-token", "publish-mode", "order.placed", "shadow")
	require.ErrorContains(t, err, "400", "a reason is required")
	_, err = admin("ops-token", "publish-mode", "order.nope", "shadow", "--reason", "x")
	require.ErrorContains(t, err, "422")
	out, err = admin("ops-token", "publish-mode", "order.placed", "shadow", "--reason", "migration step 2")
	require.NoError(t, err, out)
	require.Contains(t, out, "order.placed: publish mode outbox -> shadow")
	req, err := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(
		`{"email": "alice@example.com", "currency": "EUR", "items": [{"sku": "BOOK-1", "quantity": 1, "unit_price_cents": 100}]}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer alice-token")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusCreated, res.StatusCode)
	require.Eventually(t, func() bool {
		out, err = admin("ops-token", "shadow-report", "--type", "order.placed")
		return err == nil && regexp.MustCompile(`order.placed\s+match\s+1`).MatchString(out)
	}, 20*time.Second, 100*time.Millisecond, "the relay compared the shadow event")
	out, err = admin("ops-token", "publish-mode", "order.placed", "outbox", "--reason", "cut over")
	require.NoError(t, err, out)
	require.Contains(t, out, "shadow -> outbox")

}

// startAdminServe runs `orders serve` over a fresh database and a kfake
// cluster, with two admin tokens (ops, ops2) and a customer's (alice), and
// returns the database, the base URL and a runner of `orders admin` with
// a token. The server stops, cleanly, when the test ends.
func startAdminServe(t *testing.T) (*pgtest.DB, string, func(token string, args ...string) (string, error)) {
	t.Helper()
	db := pgtest.New(t, schema.Orders()...)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(6, "orders.events"))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	addr := freeAddr(t)
	env := map[string]string{
		"DATABASE_URL":          db.URL,
		"HTTP_ADDR":             addr,
		"AUTH_TOKENS":           "ops-token=ops:admin,ops2-token=ops2:admin,alice-token=alice:customer",
		"KAFKA_BROKERS":         cluster.ListenAddrs()[0],
		"RELAY_POLL_INTERVAL":   "100ms",
		"REPLAY_CONSUMERS_FILE": filepath.Join("..", "..", "deploy", "consumers.yaml"),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, func(k string) string { return env[k] }, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Error("serve did not stop")
		}
	})
	base := "http://" + addr
	require.Eventually(t, func() bool {
		res, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}, 20*time.Second, 50*time.Millisecond)

	admin := func(token string, args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, append([]string{"admin"}, args...), func(k string) string {
			return map[string]string{"ADMIN_API_URL": base, "ADMIN_API_TOKEN": token}[k]
		}, &out)
		return out.String(), err
	}
	return db, base, admin
}

// TestAdminHostileInput: through the whole service (routing under /admin,
// the outbox's operations API, the CLI), a path with ".." answers 404 and
// is never redirected out of /admin; a NUL in a query value is a 400
// naming the field; `orders admin` refuses a --reason with a control
// character or over 1024 characters before sending anything, in the
// server's words; and text already in the database (an audit reason or a
// plan's reason written around the API) prints with its control
// characters escaped, so it cannot rewrite a line or forge an approval.
func TestAdminHostileInput(t *testing.T) {
	t.Parallel()
	db, base, admin := startAdminServe(t)
	ctx := context.Background()
	audits := func() int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox_audit").Scan(&n))
		return n
	}

	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string) (*http.Response, string) {
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer ops-token")
		res, err := noRedirect.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res, string(b)
	}
	for _, path := range []string{"/admin/events/../stats", "/admin/events/%2e%2e/stats", "/admin//stats", "/admin", "/admin/../orders"} {
		res, body := get(path)
		require.Equal(t, http.StatusNotFound, res.StatusCode, "%s: %s", path, body)
		require.Empty(t, res.Header.Get("Location"), "%s is not redirected", path)
	}
	res, body := get("/admin/events/parked?type=%00")
	require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
	require.Equal(t, "application/problem+json", res.Header.Get("Content-Type"))
	require.Contains(t, body, `"field":"type"`)

	id := uuid.New()
	_, err := db.Pool.Exec(ctx, `INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload, state)
		VALUES ($1, 'order', 'o-1', 1, 'order.placed', 1, '{}', 'parked')`, id)
	require.NoError(t, err)
	for reason, want := range map[string]string{
		"x\napproved by ops2":     "--reason: reason must not contain control characters (found U+000A)",
		"ok\r\x1b[2Krewritten":    "(found U+000D)",
		strings.Repeat("a", 1025): "--reason: reason must be at most 1024 characters (it has 1025)",
		"fine\u202e":              "(found U+202E)",
		"\x00":                    "(found U+0000)",
		strings.Repeat("é", 1000) + strings.Repeat("a", 30): "(it has 1030)",
	} {
		for _, args := range [][]string{
			{"resume", id.String()}, {"repair", id.String(), "--schema-version", "1"}, {"replay", "plan", "--ids", id.String()},
			{"publish-mode", "order.placed", "shadow"},
		} {
			_, err := admin("ops-token", append(args, "--reason", reason)...)
			require.ErrorContains(t, err, want, "%v", args)
		}
	}
	require.Zero(t, audits(), "nothing was sent, nothing stored")

	// Text written around the API prints as one inert line.
	_, err = db.Pool.Exec(ctx, `INSERT INTO outbox_audit (actor, action, target, reason) VALUES ('ops', 'repair', $1, $2)`,
		id.String(), "ok\r\x1b[2Kall fine")
	require.NoError(t, err)
	plan := uuid.New()
	_, err = db.Pool.Exec(ctx, `INSERT INTO outbox_replay_plan (id, created_by, reason, selector, needs_approval)
		VALUES ($1, 'ops', $2, '{"ids": []}', true)`, plan, "x\napproved by ops2")
	require.NoError(t, err)
	out, err := admin("ops-token", "show", id.String())
	require.NoError(t, err, out)
	require.Contains(t, out, `ok\r\x1b[2Kall fine`)
	out2, err := admin("ops-token", "replay", "show", plan.String())
	require.NoError(t, err, out2)
	require.Contains(t, out2, `x\napproved by ops2`)
	require.NotRegexp(t, `(?m)^approved by`, out2, "no forged approval line")
	require.NotRegexp(t, "[\x00-\x08\x0b-\x1f\x7f]", out+out2, "no control character reaches the terminal")
}

// TestAdminRefusesUnknownFlags: `orders admin` refuses, before reading its
// configuration or sending anything, a flag it does not know and one the
// command does not take, and an id that is no id; a flag may stand before
// or after the positional arguments, with or without "=".
func TestAdminRefusesUnknownFlags(t *testing.T) {
	t.Parallel()
	// No server listens here: each case must fail before a request.
	env := map[string]string{"ADMIN_API_URL": "http://127.0.0.1:1", "ADMIN_API_TOKEN": "t"}
	admin := func(args ...string) error {
		return runAdmin(context.Background(), args, func(k string) string { return env[k] }, io.Discard)
	}
	for args, want := range map[string]string{
		"parked --typo x": "unknown flag --typo",
		"stats --wait":    "--wait does not go with this command",
		"show " + uuid.NewString() + " --reason r":                  "--reason does not go with this command",
		"replay approve " + uuid.NewString() + " --wait --reason r": "--wait does not go with this command",
		"resume --reason":             "--reason needs a value",
		"replay show not-an-id":       `"not-an-id" is not a plan id`,
		"resume not-an-id --reason r": `"not-an-id" is not an event id`,
		"parked --since yesterday":    "--since \"yesterday\": want an RFC 3339 time or a duration",
		"--json=yes stats":            "--json takes no value",
	} {
		err := admin(strings.Fields(args)...)
		require.ErrorContains(t, err, want, args)
		require.NotContains(t, err.Error(), "127.0.0.1:1", "%s: nothing was sent", args)
	}

	a, err := parseAdminArgs([]string{"--reason=x", "resume", "ID1", "--type", "order.placed", "ID2", "-json"})
	require.NoError(t, err)
	require.Equal(t, []string{"resume", "ID1", "ID2"}, a.pos)
	require.Equal(t, "x", *a.reason)
	require.Equal(t, "order.placed", a.values["type"])
	require.True(t, a.json)
}
