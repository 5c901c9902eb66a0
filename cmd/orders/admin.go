package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxref/orders/internal/envconfig"
	"github.com/outboxref/orders/internal/outbox/adminguard"
)

const adminUsage = `usage: orders admin <command> [flags]   (ADMIN_API_URL, ADMIN_API_TOKEN; --json for raw output)

  stats                                      counts and oldest event by event type and state
  parked [--type T] [--aggregate A] [--since D]
                                             parked events with their error class and last error
  show EVENT_ID                              one event: payload, delivery, audit trail, replays
  repair EVENT_ID (--payload FILE | --schema-version N) --reason R
                                             replace the payload or schema version of a parked event
  resume (EVENT_ID... | --type T) --reason R back to pending with the same event_id and version
  replay plan (--ids ID,ID | --from T --to T [--type T]) --reason R
                                             store a plan and print what it would do; publishes nothing
  replay show PLAN_ID                        a plan and its progress
  replay approve PLAN_ID --reason R          a second admin's approval
  replay run PLAN_ID --reason R [--wait]     publish the plan's events again, same event_id
                                             (or continue an interrupted run)
  publish-mode                               every event type's publish mode
  publish-mode TYPE direct|shadow|outbox --reason R
                                             switch which path sends TYPE's events (migration
                                             from publishing inside the transaction)
  shadow-report [--type T] [--since D]       what shadow mode found: matches, mismatches, missing
`

// adminConfig is how `orders admin` reaches the API.
type adminConfig struct {
	URL   string // ADMIN_API_URL
	Token string // ADMIN_API_TOKEN: an admin-role token
}

func loadAdminConfig(getenv func(string) string) (adminConfig, error) {
	r := envconfig.New(getenv)
	c := adminConfig{URL: strings.TrimRight(r.String("ADMIN_API_URL", "http://127.0.0.1:8080"), "/"), Token: r.String("ADMIN_API_TOKEN", "")}
	if c.Token == "" {
		r.Fail("ADMIN_API_TOKEN is required: a token of the admin role (AUTH_TOKENS of orders serve)")
	}
	if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		r.Fail("ADMIN_API_URL=%q: want an http(s) URL", c.URL)
	}
	if err := r.Err(); err != nil {
		return adminConfig{}, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return c, nil
}

// cliArgs splits arguments into positionals and --flags, wherever they
// stand: "resume ID1 ID2 --reason R" reads as naturally as the reverse.
type cliArgs struct {
	pos   []string
	flags map[string]string
}

func parseArgs(args []string, boolFlags ...string) (cliArgs, error) {
	a := cliArgs{flags: map[string]string{}}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if !strings.HasPrefix(arg, "--") {
			a.pos = append(a.pos, arg)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
		isBool := false
		for _, b := range boolFlags {
			isBool = isBool || b == name
		}
		switch {
		case isBool:
			a.flags[name] = "true"
		case hasValue:
			a.flags[name] = value
		case i+1 < len(args):
			a.flags[name] = args[i+1]
			i++
		default:
			return a, fmt.Errorf("--%s needs a value", name)
		}
	}
	return a, nil
}

// runAdmin is `orders admin`: a thin client of the /admin API. It prints
// tables by default and the API's JSON with --json.
func runAdmin(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "--help" {
		fmt.Fprint(stdout, adminUsage)
		if len(args) == 0 {
			return errors.New("expected an admin command")
		}
		return nil
	}
	cfg, err := loadAdminConfig(getenv)
	if err != nil {
		return err
	}
	a, err := parseArgs(args[1:], "json", "wait")
	if err != nil {
		return err
	}
	// The server's rule, checked before sending, in the server's words:
	// a reason with a control character or over the limit is refused.
	if r, ok := a.flags["reason"]; ok {
		if err := adminguard.CheckReason(r); err != nil {
			return fmt.Errorf("--reason: %w", err)
		}
	}
	c := &adminClient{cfg: cfg, http: &http.Client{Timeout: 30 * time.Second}, json: a.flags["json"] == "true", out: stdout}
	switch args[0] {
	case "stats":
		var stats []map[string]any
		return c.do(ctx, "GET", "/admin/stats", nil, &stats, func() {
			c.table([]string{"EVENT_TYPE", "STATE", "COUNT", "OLDEST"}, stats, "event_type", "state", "count", "oldest")
		})
	case "parked":
		q := url.Values{}
		for _, f := range []string{"type", "aggregate", "since"} {
			if v := a.flags[f]; v != "" {
				q.Set(f, v)
			}
		}
		var list []map[string]any
		return c.do(ctx, "GET", "/admin/events/parked?"+q.Encode(), nil, &list, func() {
			c.table([]string{"EVENT_ID", "EVENT_TYPE", "AGGREGATE", "VERSION", "ATTEMPTS", "CLASS", "LAST_ERROR"}, list,
				"event_id", "event_type", "aggregate_id", "aggregate_version", "attempts", "error_class", "last_error")
		})
	case "show":
		if len(a.pos) != 1 {
			return errors.New("usage: orders admin show EVENT_ID")
		}
		var d map[string]any
		return c.do(ctx, "GET", "/admin/events/"+url.PathEscape(a.pos[0]), nil, &d, func() { c.show(d) })
	case "repair":
		if len(a.pos) != 1 {
			return errors.New("usage: orders admin repair EVENT_ID (--payload FILE | --schema-version N) --reason R")
		}
		body := map[string]any{"reason": a.flags["reason"]}
		if f := a.flags["payload"]; f != "" {
			b, err := os.ReadFile(f)
			if err != nil {
				return fmt.Errorf("read the payload: %w", err)
			}
			if !json.Valid(b) {
				return fmt.Errorf("%s is not JSON", f)
			}
			body["payload"] = json.RawMessage(b)
		}
		if v := a.flags["schema-version"]; v != "" {
			var n int
			if _, err := fmt.Sscan(v, &n); err != nil || n < 1 {
				return fmt.Errorf("--schema-version %q: want a positive integer", v)
			}
			body["schema_version"] = n
		}
		var d map[string]any
		return c.do(ctx, "POST", "/admin/events/"+url.PathEscape(a.pos[0])+"/repair", body, &d, func() {
			fmt.Fprintf(c.out, "repaired %s (still parked; resume it to send it)\n", a.pos[0])
		})
	case "resume":
		body := map[string]any{"reason": a.flags["reason"]}
		if len(a.pos) > 0 {
			body["ids"] = a.pos
		}
		if t := a.flags["type"]; t != "" {
			body["type"] = t
		}
		var res struct {
			Resumed []string `json:"resumed"`
		}
		return c.do(ctx, "POST", "/admin/events/resume", body, &res, func() {
			fmt.Fprintf(c.out, "resumed %d events: %s\n", len(res.Resumed), adminguard.Printable(strings.Join(res.Resumed, " ")))
		})
	case "replay":
		return c.replay(ctx, a)
	case "publish-mode":
		return c.publishMode(ctx, a)
	case "shadow-report":
		q := url.Values{}
		for _, f := range []string{"type", "since"} {
			if v := a.flags[f]; v != "" {
				q.Set(f, v)
			}
		}
		var rep struct {
			Since  string           `json:"since"`
			Counts []map[string]any `json:"counts"`
			Diffs  []map[string]any `json:"diffs"`
		}
		return c.do(ctx, "GET", "/admin/shadow-report?"+q.Encode(), nil, &rep, func() {
			fmt.Fprintf(c.out, "shadow comparisons of events sent since %s\n", rep.Since)
			c.table([]string{"EVENT_TYPE", "RESULT", "COUNT"}, rep.Counts, "event_type", "result", "count")
			if len(rep.Diffs) > 0 {
				fmt.Fprintln(c.out, "\nlatest differences:")
				c.table([]string{"EVENT_ID", "EVENT_TYPE", "SENT_AT", "RESULT", "DETAIL"}, rep.Diffs,
					"event_id", "event_type", "sent_at", "result", "detail")
			}
		})
	default:
		fmt.Fprint(stdout, adminUsage)
		return fmt.Errorf("unknown admin command %q", args[0])
	}
}

// publishMode lists the modes, or switches one type's mode.
func (c *adminClient) publishMode(ctx context.Context, a cliArgs) error {
	switch len(a.pos) {
	case 0:
		var list []map[string]any
		return c.do(ctx, "GET", "/admin/publish-modes", nil, &list, func() {
			c.table([]string{"EVENT_TYPE", "MODE", "CHANGED_AT", "CHANGED_BY"}, list, "event_type", "mode", "changed_at", "changed_by")
		})
	case 2:
		var res map[string]any
		body := map[string]any{"mode": a.pos[1], "reason": a.flags["reason"]}
		return c.do(ctx, "PUT", "/admin/publish-modes/"+url.PathEscape(a.pos[0]), body, &res, func() {
			fmt.Fprintf(c.out, "%s: publish mode %s -> %s\n", adminguard.Printable(a.pos[0]), cell(res["from"]), cell(res["to"]))
		})
	default:
		return errors.New("usage: orders admin publish-mode [TYPE direct|shadow|outbox --reason R]")
	}
}

func (c *adminClient) replay(ctx context.Context, a cliArgs) error {
	if len(a.pos) == 0 {
		return errors.New("usage: orders admin replay plan|show|approve|run …")
	}
	sub, rest := a.pos[0], a.pos[1:]
	var plan map[string]any
	switch sub {
	case "plan":
		body := map[string]any{"reason": a.flags["reason"]}
		if ids := a.flags["ids"]; ids != "" {
			body["ids"] = strings.Split(ids, ",")
		}
		for _, f := range []string{"from", "to", "type"} {
			if v := a.flags[f]; v != "" {
				body[f] = v
			}
		}
		return c.do(ctx, "POST", "/admin/replays", body, &plan, func() { c.showPlan(plan) })
	case "show", "approve", "run":
		if len(rest) != 1 {
			return fmt.Errorf("usage: orders admin replay %s PLAN_ID", sub)
		}
		path := "/admin/replays/" + url.PathEscape(rest[0])
		if sub == "show" {
			return c.do(ctx, "GET", path, nil, &plan, func() { c.showPlan(plan) })
		}
		err := c.do(ctx, "POST", path+"/"+sub, map[string]any{"reason": a.flags["reason"]}, &plan, func() {
			if sub != "run" || a.flags["wait"] != "true" {
				c.showPlan(plan)
			}
		})
		if err != nil || sub != "run" || a.flags["wait"] != "true" {
			return err
		}
		// An interrupted plan is continued by the next orders process.
		for plan["status"] == "running" || plan["status"] == "approved" || plan["status"] == "planned" || plan["status"] == "interrupted" {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
			if err := c.call(ctx, "GET", path, nil, &plan); err != nil {
				return err
			}
		}
		c.print(plan, func() { c.showPlan(plan) })
		if plan["status"] != "done" {
			return fmt.Errorf("replay %s ended %s: %s", rest[0], cell(plan["status"]), cell(plan["run_error"]))
		}
		return nil
	default:
		return fmt.Errorf("unknown replay command %q", sub)
	}
}

// adminClient calls the admin API and prints its answers.
type adminClient struct {
	cfg  adminConfig
	http *http.Client
	json bool
	out  io.Writer
}

// do calls the API and prints the result: the JSON itself with --json,
// else through human.
func (c *adminClient) do(ctx context.Context, method, path string, body, into any, human func()) error {
	if err := c.call(ctx, method, path, body, into); err != nil {
		return err
	}
	c.print(into, human)
	return nil
}

func (c *adminClient) print(v any, human func()) {
	if c.json {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		_ = enc.Encode(v)
		return
	}
	human()
}

func (c *adminClient) call(ctx context.Context, method, path string, body, into any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.cfg.URL+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	req.Header.Set("Content-Type", "application/json")
	res, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read the answer: %w", method, path, err)
	}
	if res.StatusCode >= 300 {
		var p struct {
			Title  string `json:"title"`
			Detail string `json:"detail"`
		}
		_ = json.Unmarshal(b, &p)
		return fmt.Errorf("%s %s: %s: %s", method, path, res.Status, adminguard.Printable(p.Detail))
	}
	if err := json.Unmarshal(b, into); err != nil {
		return fmt.Errorf("%s %s: decode the answer: %w", method, path, err)
	}
	return nil
}

func (c *adminClient) table(header []string, rows []map[string]any, keys ...string) {
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		cells := make([]string, len(keys))
		for i, k := range keys {
			cells[i] = cell(r[k])
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	_ = tw.Flush()
}

func cell(v any) string {
	switch x := v.(type) {
	case nil:
		return "-"
	case float64:
		return fmt.Sprintf("%.0f", x)
	case string:
		// Text from the server (an audit reason, a last error) prints as
		// one inert line: "\r" or ESC[2K would rewrite what the operator
		// reads, "\n" would forge a line of its own.
		return adminguard.Printable(x)
	default:
		b, _ := json.Marshal(x)
		return string(b)
	}
}

func (c *adminClient) show(d map[string]any) {
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	for _, k := range []string{"event_id", "event_type", "aggregate_type", "aggregate_id", "aggregate_version", "schema_version",
		"state", "created_at", "attempts", "error_class", "last_error", "delivered_at", "broker_partition", "broker_offset", "archived"} {
		if v, ok := d[k]; ok {
			fmt.Fprintf(tw, "%s\t%s\n", k, cell(v))
		}
	}
	_ = tw.Flush()
	if p, ok := d["payload"]; ok {
		b, _ := json.MarshalIndent(p, "", "  ")
		fmt.Fprintf(c.out, "payload:\n%s\n", b)
	}
	if audit, ok := d["audit"].([]any); ok && len(audit) > 0 {
		fmt.Fprintln(c.out, "audit:")
		rows := make([]map[string]any, len(audit))
		for i, a := range audit {
			rows[i], _ = a.(map[string]any)
		}
		c.table([]string{"AT", "ACTOR", "ACTION", "REASON"}, rows, "at", "actor", "action", "reason")
	}
	if replays, ok := d["replays"].([]any); ok && len(replays) > 0 {
		fmt.Fprintln(c.out, "replays:")
		rows := make([]map[string]any, len(replays))
		for i, a := range replays {
			rows[i], _ = a.(map[string]any)
		}
		c.table([]string{"PLAN", "BY", "STATE", "PUBLISHED_AT", "OFFSET"}, rows, "plan_id", "planned_by", "state", "published_at", "broker_offset")
	}
}

func (c *adminClient) showPlan(p map[string]any) {
	fmt.Fprintf(c.out, "plan %s: %s (planned by %s: %s)\n", cell(p["id"]), cell(p["status"]), cell(p["created_by"]), cell(p["reason"]))
	if p["needs_approval"] == true && p["approved_by"] == nil {
		fmt.Fprintln(c.out, "needs the approval of a second admin: orders admin replay approve", cell(p["id"]), "--reason R")
	}
	if by, ok := p["approved_by"].(string); ok {
		fmt.Fprintf(c.out, "approved by %s (valid until %v)\n", cell(by), cell(p["approval_expires_at"]))
	}
	if owner, ok := p["run_owner"].(string); ok {
		fmt.Fprintf(c.out, "run by %s (lease until %v)\n", cell(owner), cell(p["run_lease_expires_at"]))
	}
	fmt.Fprintf(c.out, "events to publish: %v (published: %v)\n", cell(p["events"]), cell(p["published"]))
	if counts, ok := p["counts"].(map[string]any); ok {
		types := make([]string, 0, len(counts))
		for t := range counts {
			types = append(types, t)
		}
		sort.Strings(types)
		for _, t := range types {
			fmt.Fprintf(c.out, "  %-28s %s\n", cell(t), cell(counts[t]))
		}
	}
	consumers, _ := p["consumers"].([]any)
	if len(consumers) == 0 {
		fmt.Fprintln(c.out, "consumers: none known (REPLAY_CONSUMERS_FILE is not set, or no consumer reads these types)")
	}
	for _, x := range consumers {
		cons, _ := x.(map[string]any)
		fmt.Fprintf(c.out, "consumer %s: sees %s events", cell(cons["name"]), cell(cons["events"]))
		if ret, ok := cons["inbox_retention"].(float64); ok {
			fmt.Fprintf(c.out, ", inbox retention %s", time.Duration(ret))
		}
		fmt.Fprintln(c.out)
		if se, ok := cons["side_effects"].(map[string]any); ok {
			for t, e := range se {
				fmt.Fprintf(c.out, "  side effect of %s: %s (absorbed while its inbox remembers the event)\n", cell(t), cell(e))
			}
		}
		tooOld, _ := cons["too_old"].([]any)
		for _, id := range tooOld {
			fmt.Fprintf(c.out, "  WARNING: event %s is older than %s's inbox retention: it may be applied again, side effects included\n", cell(id), cell(cons["name"]))
		}
	}
	skipped, _ := p["skipped"].([]any)
	for _, x := range skipped {
		s, _ := x.(map[string]any)
		fmt.Fprintf(c.out, "skipped %s: %s\n", cell(s["event_id"]), cell(s["reason"]))
	}
}
