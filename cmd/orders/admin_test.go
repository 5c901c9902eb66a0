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

	"github.com/outboxref/orders/db/migrations"
	"github.com/outboxref/orders/internal/pgtest"
)

// TestAdminCLI runs `orders admin` against a live `orders serve` (O4, O5,
// S1): an event the relay parks shows in `parked`; `repair` then `resume`
// deliver it with the same event_id; the audit names the actor. A replay
// plan publishes nothing; a time-range plan runs only after a second admin
// approves it; the run republishes the original event. Customers get 403.
func TestAdminCLI(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, migrations.Orders()...)
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
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, func(k string) string { return env[k] }, io.Discard) }()
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

	// An event written by code newer than this relay: schema version 2.
	id := uuid.New()
	order := uuid.New()
	_, err = db.Pool.Exec(ctx, `INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
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

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop")
	}
}
