package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

// runbookBlock is one fenced command block of docs/runbook.md and the
// marker on the line before it: <!-- runbook-test: NAME -->.
type runbookBlock struct {
	line       int
	lang, body string
	marker     string
}

// readRunbook returns every sh and sql block of the runbook. A block
// without a marker fails the test: each command the runbook shows is
// either run here, drilled by another named test, or says why not.
func readRunbook(t *testing.T) []runbookBlock {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "docs", "runbook.md"))
	require.NoError(t, err)
	defer f.Close()
	var (
		blocks  []runbookBlock
		cur     *runbookBlock
		prev    string
		lineNo  int
		markerR = regexp.MustCompile(`^<!-- runbook-test: (.+) -->$`)
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```") && len(line) > 3:
			cur = &runbookBlock{line: lineNo, lang: strings.TrimPrefix(line, "```")}
			if m := markerR.FindStringSubmatch(prev); m != nil {
				cur.marker = m[1]
			}
		case cur != nil && line == "```":
			if cur.lang == "sh" || cur.lang == "sql" {
				require.NotEmpty(t, cur.marker, "docs/runbook.md:%d: a %s block without a <!-- runbook-test: … --> marker", cur.line, cur.lang)
				blocks = append(blocks, *cur)
			}
			cur = nil
		case cur != nil:
			cur.body += line + "\n"
		}
		prev = line
	}
	require.NoError(t, sc.Err())
	return blocks
}

// runbookAnchors are the headings' GitHub anchors.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "docs", "runbook.md"))
	require.NoError(t, err)
	anchors := map[string]bool{}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	for _, l := range strings.Split(string(doc), "\n") {
		if h, ok := strings.CutPrefix(l, "## "); ok {
			anchors[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")] = true
		}
	}
	return anchors
}

// runbookStep prepares the stack for one block and checks what it printed.
type runbookStep struct {
	before func(t *testing.T, env map[string]string)
	// env overrides the shared environment for this block only.
	env   map[string]string
	check func(t *testing.T, out string, env map[string]string)
}

// TestRunbookCommands runs every command docs/runbook.md shows, as
// written, against a live stack (orders with its relay, the notifier,
// kfake over TCP, an SMTP server), in the order of the document, after
// putting the stack in the state each section is about. The restore
// section is drilled by TestDisasterRecovery; here it is checked that the
// drill runs the commands the section shows. Every alert's runbook link
// must name a section.
func TestRunbookCommands(t *testing.T) {
	t.Parallel()
	blocks := readRunbook(t)
	anchors := runbookAnchors(t)
	alerts, err := os.ReadFile(filepath.Join("..", "deploy", "prometheus", "alerts.yml"))
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`runbook: docs/runbook\.md#(\S+)`).FindAllStringSubmatch(string(alerts), -1) {
		require.True(t, anchors[m[1]], "alerts.yml links to docs/runbook.md#%s, which is no section", m[1])
	}
	drill, err := os.ReadFile("recovery_test.go")
	require.NoError(t, err)

	tokens := devTokens + ",dev-ops2=ops2:admin"
	c := newChain(t, map[string]string{"AUTH_TOKENS": tokens, "REPLAY_CONSUMERS_FILE": filepath.Join("..", "deploy", "consumers.yaml")})
	notifier := start(t, "notifier", c.notifierEnv(map[string]string{"AUTH_TOKENS": tokens}), "serve")
	notifierURL := "http://" + c.notifierAddr
	waitReady(t, notifier, notifierURL+"/readyz")

	// Each block runs as in the demo, in a shell that sourced
	// scripts/demo-env.sh: in a copy of the repository's layout whose
	// .demo/bin holds the binaries under test, with the demo's ports set to
	// the test's. The script itself sets PATH, ORDERS_URL, NOTIFIER_URL,
	// ADMIN_API_TOKEN and each CLI's ADMIN_API_URL; only the databases,
	// whose names differ from the demo's, are set again after it.
	work := demoRoot(t)
	demoPorts := map[string]string{"ORDERS_PORT": port(t, c.ordersAddr), "NOTIFIER_PORT": port(t, c.notifierAddr)}
	env := map[string]string{
		"ORDERS_DATABASE_URL":   c.odb.URL,
		"NOTIFIER_DATABASE_URL": c.ndb.URL,
	}
	ctx := context.Background()
	c.traffic(t)

	var dupsBeforeReplay float64
	steps := map[string]runbookStep{
		"backlog": {check: func(t *testing.T, out string, _ map[string]string) {
			require.Regexp(t, `order\.placed\s+delivered\s+\d+`, out)
			require.Contains(t, out, "outbox_oldest_pending_age_seconds")
		}},
		"parked": {
			before: func(t *testing.T, env map[string]string) {
				// Written by newer code: a schema version this relay lacks.
				id := uuid.New()
				_, err := c.odb.Pool.Exec(ctx, `INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
					VALUES ($1, 'order', $2, 1, 'order.placed', 2, '{"order_id": "x"}')`, id, uuid.NewString())
				require.NoError(t, err)
				require.Eventually(t, func() bool { return outboxState(t, c, id) == "parked" }, 20*time.Second, 50*time.Millisecond)
				env["EVENT_ID"] = id.String()
			},
			check: func(t *testing.T, out string, env map[string]string) {
				require.Contains(t, out, env["EVENT_ID"])
				require.Contains(t, out, "unknown_schema_version")
			},
		},
		"repair": {
			before: func(t *testing.T, env map[string]string) {
				var agg string
				require.NoError(t, c.odb.Pool.QueryRow(ctx, "SELECT aggregate_id FROM outbox WHERE event_id = $1", env["EVENT_ID"]).Scan(&agg))
				require.NoError(t, os.WriteFile(filepath.Join(work, "fixed.json"), fmt.Appendf(nil, `{"order_id": %q, "customer": "alice",
					"email": "alice@example.com", "currency": "EUR", "items": [{"sku": "BOOK-1", "quantity": 1, "unit_price_cents": 100}],
					"total_cents": 100, "placed_at": "2026-01-01T00:00:00Z"}`, agg), 0o600))
			},
			check: func(t *testing.T, out string, env map[string]string) {
				require.Contains(t, out, "resumed 1 events")
				id := uuid.MustParse(env["EVENT_ID"])
				require.Eventually(t, func() bool { return outboxState(t, c, id) == "delivered" }, 20*time.Second, 50*time.Millisecond,
					"the repaired event is delivered with its own event_id")
			},
		},
		"broker": {check: func(t *testing.T, out string, _ map[string]string) {
			require.Contains(t, out, `"broker":"ok"`)
		}},
		"notifier-db": {check: func(t *testing.T, out string, _ map[string]string) {
			require.Contains(t, out, "notifier_consumer_degraded 0")
		}},
		"replay-plan": {
			before: func(t *testing.T, env map[string]string) {
				env["FROM"] = time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
				env["TO"] = time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
			},
			check: func(t *testing.T, out string, env map[string]string) {
				m := regexp.MustCompile(`plan (\S+): planned`).FindStringSubmatch(out)
				require.NotNil(t, m, "the plan's id in the first line")
				env["PLAN_ID"] = m[1]
			},
		},
		"replay-approve": {
			env:   map[string]string{"ADMIN_API_TOKEN": "dev-ops2"},
			check: func(t *testing.T, out string, _ map[string]string) { require.Contains(t, out, "approved by ops2") },
		},
		"replay-run": {
			before: func(t *testing.T, _ map[string]string) {
				var err error
				dupsBeforeReplay, err = scrapeMetric(notifierURL+"/metrics", "inbox_duplicates_total")
				require.NoError(t, err)
			},
			check: func(t *testing.T, out string, env map[string]string) {
				require.Contains(t, out, ": done")
				// The notifier absorbs the replayed events: duplicates, and
				// no email twice.
				var replayed int
				require.NoError(t, c.odb.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox_replay_item WHERE plan_id = $1 AND state = 'published'",
					env["PLAN_ID"]).Scan(&replayed))
				require.Positive(t, replayed)
				require.Eventually(t, func() bool {
					dups, err := scrapeMetric(notifierURL+"/metrics", "inbox_duplicates_total")
					return err == nil && dups >= dupsBeforeReplay+float64(replayed)
				}, 30*time.Second, 100*time.Millisecond, "the notifier counts the %d replayed events as duplicates", replayed)
				seen := map[string]bool{}
				for _, m := range c.smtp.Received() {
					require.False(t, seen[m.MessageID], "Message-ID %s sent twice", m.MessageID)
					seen[m.MessageID] = true
				}
			},
		},
		"notifier-sql": {},
		"notifier-parked": {
			before: func(t *testing.T, env map[string]string) {
				// A record an older notifier could not process, parked raw.
				order := uuid.NewString()
				rec := cloudevents.Record(topic, cloudevents.Event{
					ID: uuid.New(), Type: "order.placed", Source: "urn:outboxref:orders", Time: time.Now(),
					AggregateType: "order", AggregateID: order, AggregateVersion: 1, SchemaVersion: 1,
					Data: fmt.Appendf(nil, `{"order_id": %q, "customer": "bob", "email": "bob@example.com",
						"currency": "EUR", "items": [{"sku": "A", "quantity": 1, "unit_price_cents": 5}], "total_cents": 5,
						"placed_at": "2026-01-01T00:00:00Z"}`, order),
				})
				rec.Partition, rec.Offset = 0, 1_000_000
				stored, err := inbox.ParkRecord(ctx, c.ndb.Pool, rec, "schema version 1 unknown to notifier 1.3")
				require.NoError(t, err)
				require.True(t, stored)
				var id int64
				require.NoError(t, c.ndb.Pool.QueryRow(ctx, "SELECT max(id) FROM inbox_parked_record").Scan(&id))
				env["RECORD_ID"] = fmt.Sprint(id)
			},
			check: func(t *testing.T, out string, _ map[string]string) { require.Contains(t, out, "notifier 1.3") },
		},
		"notifier-retry": {check: func(t *testing.T, out string, _ map[string]string) { require.Contains(t, out, "applied") }},
		"notifier-forged": {
			before: func(t *testing.T, env map[string]string) {
				// A record at version 3 of an order nobody placed: held
				// behind the versions that will never come.
				order := uuid.NewString()
				id := uuid.New()
				produceRecord(t, c.broker, cloudevents.Record(topic, cloudevents.Event{
					ID: id, Type: "order.shipped", Source: "urn:outboxref:orders", Time: time.Now(),
					AggregateType: "order", AggregateID: order, AggregateVersion: 3, SchemaVersion: 1,
					Data: fmt.Appendf(nil, `{"order_id": %q, "email": "bob@example.com", "shipped_at": "2026-01-01T00:00:00Z"}`, order),
				}))
				require.Eventually(t, func() bool {
					var n int
					_ = c.ndb.Pool.QueryRow(ctx, "SELECT count(*) FROM inbox_held_event WHERE event_id = $1", id).Scan(&n)
					return n == 1
				}, 30*time.Second, 100*time.Millisecond, "the forged record is held")
				env["EVENT_ID"] = id.String()
			},
			check: func(t *testing.T, out string, env map[string]string) {
				require.Contains(t, out, "VERDICT")
				require.Contains(t, out, env["EVENT_ID"])
			},
		},
		"notifier-drop": {check: func(t *testing.T, out string, env map[string]string) {
			require.Contains(t, out, "dropped")
			var state, by string
			require.NoError(t, c.ndb.Pool.QueryRow(ctx, "SELECT state, rejected_by FROM inbox_held_event WHERE event_id = $1", env["EVENT_ID"]).Scan(&state, &by))
			require.Equal(t, "rejected", state)
			require.Equal(t, "ops", by)
		}},
		"emails": {
			before: func(t *testing.T, env map[string]string) {
				// A send whose connection dropped after DATA.
				var key string
				require.NoError(t, c.ndb.Pool.QueryRow(ctx, `UPDATE email_send SET state = 'unknown'
					WHERE operation_key = (SELECT operation_key FROM email_send WHERE state = 'sent' ORDER BY operation_key LIMIT 1)
					RETURNING operation_key`).Scan(&key))
				env["EMAIL_KEY"] = key
			},
			check: func(t *testing.T, out string, env map[string]string) {
				require.Contains(t, out, env["EMAIL_KEY"])
				var state string
				require.NoError(t, c.ndb.Pool.QueryRow(ctx, "SELECT state FROM email_send WHERE operation_key = $1", env["EMAIL_KEY"]).Scan(&state))
				require.Equal(t, "sent", state)
			},
		},
		"tokens": {
			env:   map[string]string{"NEW_TOKEN": "dev-alice", "OLD_TOKEN": "retired-token"},
			check: func(t *testing.T, out string, _ map[string]string) { require.Equal(t, "200\n401\n", out) },
		},
		"kafka-credentials": {check: func(t *testing.T, out string, _ map[string]string) {
			require.Regexp(t, `class="auth".* 0\n`, out)
		}},
		"publish-mode": {
			check: func(t *testing.T, out string, _ map[string]string) {
				require.Contains(t, out, "order.placed: publish mode outbox -> shadow")
				require.Contains(t, out, "order.placed: publish mode shadow -> outbox")
			},
		},
		"claim-plan": {check: func(t *testing.T, out string, _ map[string]string) { require.Contains(t, out, "outbox") }},
		"capacity": {check: func(t *testing.T, out string, _ map[string]string) {
			require.Contains(t, out, "notifier_consumer_degraded")
			require.Contains(t, out, "outbox_lost_confirms_total")
		}},
		"cleanup": {check: func(t *testing.T, out string, _ map[string]string) {
			for _, m := range []string{"outbox_cleanup_deleted_total", "orders_cleanup_deleted_total", "notifier_cleanup_deleted_total"} {
				require.Contains(t, out, m)
			}
		}},
	}

	used := map[string]bool{}
	for _, b := range blocks {
		switch {
		case strings.HasPrefix(b.marker, "skip, "):
			continue
		case strings.HasPrefix(b.marker, "drill "):
			test := strings.TrimPrefix(b.marker, "drill ")
			require.Contains(t, string(drill), "func "+test+"(", "docs/runbook.md:%d names a drill that does not exist", b.line)
			for _, l := range strings.Split(b.body, "\n") {
				if l = strings.TrimSpace(l); l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, "-") || strings.HasPrefix(l, "|") {
					continue
				}
				cmd := strings.Fields(l)[0]
				if strings.Contains(cmd, "=") { // VAR=value command
					cmd = strings.Fields(l)[1]
				}
				require.Contains(t, string(drill), `"`+cmd+`"`, "docs/runbook.md:%d: %s is not run by %s", b.line, cmd, test)
			}
			continue
		}
		step, ok := steps[b.marker]
		require.True(t, ok, "docs/runbook.md:%d: no test step for block %q", b.line, b.marker)
		used[b.marker] = true
		t.Logf("docs/runbook.md:%d (%s)", b.line, b.marker)
		if step.before != nil {
			step.before(t, env)
		}
		out := runRunbookBlock(t, b, demoPorts, env, step.env, work, c)
		if step.check != nil {
			step.check(t, out, env)
		}
	}
	for name := range steps {
		require.True(t, used[name], "test step %q has no block in docs/runbook.md", name)
	}
}

// demoRoot returns a directory laid out as the repository is for the
// demo: scripts/demo-env.sh and scripts/demo.env copied from this
// repository, and .demo/bin, where demo.sh builds the binaries, linked to
// the binaries under test.
func demoRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "scripts"), 0o755))
	for _, name := range []string{"demo-env.sh", "demo.env"} {
		b, err := os.ReadFile(filepath.Join("..", "scripts", name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(root, "scripts", name), b, 0o644))
	}
	require.NoError(t, os.MkdirAll(filepath.Join(root, ".demo"), 0o755))
	require.NoError(t, os.Symlink(binDir, filepath.Join(root, ".demo", "bin")))
	return root
}

// port returns the port of a host:port address.
func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	return p
}

// runRunbookBlock runs a sh block with bash (-e, -u, pipefail) or a sql
// block with psql against the database its marker names, and returns the
// output. A sh block runs in dir, as a user of the demo runs it: after
// `. scripts/demo-env.sh` with demoEnv in the environment, then with the
// variables of env and extra exported (the test's databases and the values
// each section's prose tells the reader to set).
func runRunbookBlock(t *testing.T, b runbookBlock, demoEnv, env, extra map[string]string, dir string, c *chain) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var cmd *exec.Cmd
	switch b.lang {
	case "sh":
		var script strings.Builder
		script.WriteString(". scripts/demo-env.sh\n")
		for _, m := range []map[string]string{env, extra} {
			for k, v := range m {
				fmt.Fprintf(&script, "export %s='%s'\n", k, strings.ReplaceAll(v, "'", `'\''`))
			}
		}
		script.WriteString(b.body)
		cmd = exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script.String())
	case "sql":
		dbURL := c.odb.URL
		if strings.HasPrefix(b.marker, "notifier") {
			dbURL = c.ndb.URL
		}
		cmd = exec.CommandContext(ctx, "psql", dbURL, "-X", "-v", "ON_ERROR_STOP=1", "-c", b.body)
	}
	cmd.Dir = dir
	cmd.Env = os.Environ()
	for k, v := range demoEnv {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "docs/runbook.md:%d (%s) failed:\n%s\noutput:\n%s", b.line, b.marker, b.body, out)
	return string(out)
}

func outboxState(t *testing.T, c *chain, id uuid.UUID) string {
	t.Helper()
	var s string
	require.NoError(t, c.odb.Pool.QueryRow(context.Background(), "SELECT state FROM outbox WHERE event_id = $1", id).Scan(&s))
	return s
}

// produceRecord writes one record to the topic and waits for the ack.
func produceRecord(t *testing.T, broker string, r *kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker))
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.ProduceSync(context.Background(), r).FirstErr())
}
