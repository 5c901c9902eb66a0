package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/orders/internal/envconfig"
	"github.com/outboxref/orders/internal/outbox/adminguard"
	"github.com/outboxref/orders/internal/outbox/operate"
)

const adminUsage = `usage: orders admin <command> [flags]   (ADMIN_API_URL, ADMIN_API_TOKEN; --json for raw output)

A client of the /admin API of a running orders serve. Each command takes
only the flags its line shows (and --json); writes need --reason, which
goes to the audit trail with the token's subject.

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

// adminArgs are a command line's positional arguments and flags. Flags may
// come anywhere ("resume ID1 ID2 --reason R" reads as naturally as the
// reverse); an unknown flag is refused, and so is one the command does not
// take (see check), so a mistyped flag never goes unnoticed.
type adminArgs struct {
	pos    []string
	json   bool
	wait   bool
	reason *string
	// values holds the other flags by name without dashes: type,
	// aggregate, since, payload, schema-version, ids, from, to.
	values map[string]string
	// given lists every flag given, by name without dashes.
	given []string
}

// valueFlags are the flags that take a value, besides --reason.
var valueFlags = []string{"type", "aggregate", "since", "payload", "schema-version", "ids", "from", "to"}

func parseAdminArgs(args []string) (adminArgs, error) {
	a := adminArgs{values: map[string]string{}}
	for i := 0; i < len(args); i++ {
		name, value, hasValue := strings.Cut(args[i], "=")
		if !strings.HasPrefix(name, "-") || name == "-" {
			a.pos = append(a.pos, args[i])
			continue
		}
		name = strings.TrimLeft(name, "-")
		takeValue := func() (string, error) {
			if hasValue {
				return value, nil
			}
			if i+1 >= len(args) {
				return "", fmt.Errorf("--%s needs a value", name)
			}
			i++
			return args[i], nil
		}
		switch {
		case name == "json" || name == "wait":
			if hasValue {
				return a, fmt.Errorf("--%s takes no value", name)
			}
			a.json, a.wait = a.json || name == "json", a.wait || name == "wait"
		case name == "reason":
			v, err := takeValue()
			if err != nil {
				return a, err
			}
			a.reason = &v
		case slices.Contains(valueFlags, name):
			v, err := takeValue()
			if err != nil {
				return a, err
			}
			a.values[name] = v
		default:
			return a, fmt.Errorf("unknown flag --%s", adminguard.Printable(name))
		}
		a.given = append(a.given, name)
	}
	return a, nil
}

// check refuses a flag the command does not take; --json goes with every
// command.
func (a adminArgs) check(usage string, takes ...string) error {
	for _, f := range a.given {
		if f != "json" && !slices.Contains(takes, f) {
			return fmt.Errorf("--%s does not go with this command: usage: orders admin %s", f, usage)
		}
	}
	return nil
}

// runAdmin is `orders admin`: a thin layer over operate.AdminClient, the
// client of the /admin API. It prints tables by default and the API's JSON
// with --json.
func runAdmin(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "--help" {
		fmt.Fprint(stdout, adminUsage)
		if len(args) == 0 {
			return errors.New("expected an admin command")
		}
		return nil
	}
	a, err := parseAdminArgs(args)
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	if len(a.pos) == 0 {
		fmt.Fprint(stdout, adminUsage)
		return errors.New("expected an admin command")
	}
	// The server's rule, checked before sending, in the server's words:
	// a reason with a control character or over the limit is refused.
	// Whether a reason is required is the server's to say (400).
	if a.reason != nil {
		if err := adminguard.CheckReason(*a.reason); err != nil {
			return fmt.Errorf("--reason: %w", err)
		}
	}
	cfg, err := loadAdminConfig(getenv)
	if err != nil {
		return err
	}
	cmd := &adminCommand{c: operate.NewAdminClient(cfg.URL+"/admin", cfg.Token), a: a, out: stdout}
	if a.pos[0] == "replay" {
		return cmd.replay(ctx)
	}
	return cmd.run(ctx)
}

// adminCommand is one command line: the client, its arguments and where
// to print.
type adminCommand struct {
	c   *operate.AdminClient
	a   adminArgs
	out io.Writer
}

func (x *adminCommand) reason() string {
	if x.a.reason == nil {
		return ""
	}
	return *x.a.reason
}

// failed reports an error of the API. Its text comes from the server (a
// problem's detail) and goes to a terminal: it prints as one inert line.
func failed(name string, err error) error {
	return fmt.Errorf("admin %s: %s", name, adminguard.Printable(err.Error()))
}

// print writes v as indented JSON with --json, else through text.
func (x *adminCommand) print(v any, text func(io.Writer)) error {
	if x.a.json {
		enc := json.NewEncoder(x.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	text(x.out)
	return nil
}

func (x *adminCommand) run(ctx context.Context) error {
	a := x.a
	name, rest := a.pos[0], a.pos[1:]
	args := func(n int, usage string, takes ...string) error {
		if len(rest) != n {
			return fmt.Errorf("usage: orders admin %s", usage)
		}
		return a.check(usage, takes...)
	}
	switch name {
	case "stats":
		if err := args(0, "stats"); err != nil {
			return err
		}
		stats, err := x.c.Stats(ctx)
		if err != nil {
			return failed(name, err)
		}
		return x.print(stats, func(w io.Writer) { printStats(w, stats) })

	case "parked":
		if err := args(0, "parked [--type T] [--aggregate A] [--since D]", "type", "aggregate", "since"); err != nil {
			return err
		}
		f := operate.ParkedFilter{EventType: a.values["type"], AggregateID: a.values["aggregate"]}
		if s := a.values["since"]; s != "" {
			t, err := operate.ParseSince(s)
			if err != nil {
				return fmt.Errorf("--since %q: want an RFC 3339 time or a duration such as 2h", adminguard.Printable(s))
			}
			f.Since = t
		}
		list, err := x.c.Parked(ctx, f)
		if err != nil {
			return failed(name, err)
		}
		return x.print(list, func(w io.Writer) { printParked(w, list) })

	case "show":
		if err := args(1, "show EVENT_ID"); err != nil {
			return err
		}
		id, err := parseID("an event", rest[0])
		if err != nil {
			return err
		}
		d, err := x.c.Event(ctx, id)
		if err != nil {
			return failed(name, err)
		}
		return x.print(d, func(w io.Writer) { printEvent(w, d) })

	case "repair":
		if err := args(1, "repair EVENT_ID (--payload FILE | --schema-version N) --reason R", "payload", "schema-version", "reason"); err != nil {
			return err
		}
		id, err := parseID("an event", rest[0])
		if err != nil {
			return err
		}
		req := operate.RepairRequest{Reason: x.reason()}
		if f := a.values["payload"]; f != "" {
			b, err := os.ReadFile(f)
			if err != nil {
				return fmt.Errorf("read the payload: %w", err)
			}
			if !json.Valid(b) {
				return fmt.Errorf("%s is not JSON", f)
			}
			req.Payload = b
		}
		if v, ok := a.values["schema-version"]; ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return fmt.Errorf("--schema-version %q: want a positive integer", adminguard.Printable(v))
			}
			req.SchemaVersion = n
		}
		d, err := x.c.Repair(ctx, id, req)
		if err != nil {
			return failed(name, err)
		}
		return x.print(d, func(w io.Writer) {
			fmt.Fprintf(w, "repaired %s (still parked; resume it to send it)\n", d.EventID)
		})

	case "resume":
		const usage = "resume (EVENT_ID... | --type T) --reason R"
		if err := a.check(usage, "type", "reason"); err != nil {
			return err
		}
		req := operate.ResumeRequest{Type: a.values["type"], Reason: x.reason()}
		for _, s := range rest {
			id, err := parseID("an event", s)
			if err != nil {
				return err
			}
			req.IDs = append(req.IDs, id)
		}
		res, err := x.c.Resume(ctx, req)
		if err != nil {
			return failed(name, err)
		}
		return x.print(res, func(w io.Writer) {
			ids := make([]string, len(res.Resumed))
			for i, id := range res.Resumed {
				ids[i] = id.String()
			}
			fmt.Fprintf(w, "resumed %d events: %s\n", len(ids), strings.Join(ids, " "))
		})

	case "publish-mode":
		const usage = "publish-mode [TYPE direct|shadow|outbox --reason R]"
		switch len(rest) {
		case 0:
			if err := a.check(usage); err != nil {
				return err
			}
			list, err := x.c.PublishModes(ctx)
			if err != nil {
				return failed(name, err)
			}
			return x.print(list, func(w io.Writer) { printModes(w, list) })
		case 2:
			if err := a.check(usage, "reason"); err != nil {
				return err
			}
			ch, err := x.c.SetPublishMode(ctx, rest[0], operate.PublishModeRequest{Mode: operate.PublishMode(rest[1]), Reason: x.reason()})
			if err != nil {
				return failed(name, err)
			}
			return x.print(ch, func(w io.Writer) {
				fmt.Fprintf(w, "%s: publish mode %s -> %s\n", text(ch.EventType), text(string(ch.From)), text(string(ch.To)))
			})
		default:
			return errors.New("usage: orders admin " + usage)
		}

	case "shadow-report":
		if err := args(0, "shadow-report [--type T] [--since D]", "type", "since"); err != nil {
			return err
		}
		var since time.Time
		if s := a.values["since"]; s != "" {
			t, err := operate.ParseSince(s)
			if err != nil {
				return fmt.Errorf("--since %q: want an RFC 3339 time or a duration such as 2h", adminguard.Printable(s))
			}
			since = t
		}
		rep, err := x.c.ShadowReport(ctx, a.values["type"], since)
		if err != nil {
			return failed(name, err)
		}
		return x.print(rep, func(w io.Writer) { printShadowReport(w, rep) })

	default:
		fmt.Fprint(x.out, adminUsage)
		return fmt.Errorf("unknown admin command %q", adminguard.Printable(name))
	}
}

// replay is `orders admin replay plan|show|approve|run`.
func (x *adminCommand) replay(ctx context.Context) error {
	a := x.a
	if len(a.pos) < 2 {
		return errors.New("usage: orders admin replay plan|show|approve|run …")
	}
	sub, rest := a.pos[1], a.pos[2:]
	name := "replay " + sub
	if sub == "plan" {
		const usage = "replay plan (--ids ID,ID | --from T --to T [--type T]) --reason R"
		if len(rest) != 0 {
			return errors.New("usage: orders admin " + usage)
		}
		if err := a.check(usage, "ids", "from", "to", "type", "reason"); err != nil {
			return err
		}
		req := operate.PlanRequest{ReplaySelector: operate.ReplaySelector{Type: a.values["type"]}, Reason: x.reason()}
		if ids := a.values["ids"]; ids != "" {
			for _, s := range strings.Split(ids, ",") {
				id, err := parseID("an event", s)
				if err != nil {
					return err
				}
				req.IDs = append(req.IDs, id)
			}
		}
		for flag, t := range map[string]*time.Time{"from": &req.From, "to": &req.To} {
			if v := a.values[flag]; v != "" {
				var err error
				if *t, err = time.Parse(time.RFC3339, v); err != nil {
					return fmt.Errorf("--%s %q: want an RFC 3339 time", flag, adminguard.Printable(v))
				}
			}
		}
		p, err := x.c.PlanReplay(ctx, req)
		if err != nil {
			return failed(name, err)
		}
		return x.print(p, func(w io.Writer) { printPlan(w, p) })
	}

	usage := "replay " + sub + " PLAN_ID"
	var takes []string
	switch sub {
	case "show":
	case "approve":
		usage, takes = usage+" --reason R", []string{"reason"}
	case "run":
		usage, takes = usage+" --reason R [--wait]", []string{"reason", "wait"}
	default:
		return fmt.Errorf("unknown replay command %q", adminguard.Printable(sub))
	}
	if len(rest) != 1 {
		return errors.New("usage: orders admin " + usage)
	}
	if err := a.check(usage, takes...); err != nil {
		return err
	}
	id, err := parseID("a plan", rest[0])
	if err != nil {
		return err
	}
	var p operate.ReplayPlan
	switch sub {
	case "show":
		p, err = x.c.ReplayPlan(ctx, id)
	case "approve":
		p, err = x.c.ApproveReplay(ctx, id, x.reason())
	case "run":
		p, err = x.c.RunReplay(ctx, id, x.reason())
	}
	if err != nil {
		return failed(name, err)
	}
	if sub != "run" || !a.wait {
		return x.print(p, func(w io.Writer) { printPlan(w, p) })
	}
	// The run goes on in the service; an interrupted plan is continued by
	// the next orders process. Print where it ended.
	for p.Status == "running" || p.Status == "approved" || p.Status == "planned" || p.Status == "interrupted" {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		if p, err = x.c.ReplayPlan(ctx, id); err != nil {
			return failed(name, err)
		}
	}
	if err := x.print(p, func(w io.Writer) { printPlan(w, p) }); err != nil {
		return err
	}
	if p.Status != "done" {
		return fmt.Errorf("replay %s ended %s: %s", id, text(p.Status), text(p.RunError))
	}
	return nil
}

// parseID reads an event or plan id (what: "an event", "a plan") from the
// command line, so a mistyped one is refused before anything is sent.
func parseID(what, s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, fmt.Errorf("%q is not %s id", adminguard.Printable(s), what)
	}
	return id, nil
}

// text is a string from the server as it prints: "-" when empty, and one
// inert line otherwise. "\r" or ESC[2K would rewrite what the operator
// reads, "\n" would forge a line of its own.
func text(s string) string {
	if s == "" {
		return "-"
	}
	return adminguard.Printable(s)
}

// when prints a time as the API sends it (RFC 3339), "-" when unset.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Format(time.RFC3339Nano)
}

func whenPtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return when(*t)
}

func numPtr[T int32 | int64](n *T) string {
	if n == nil {
		return "-"
	}
	return fmt.Sprint(*n)
}

// table prints rows under a header, aligned; the cells are already
// printable (text, when).
func table(w io.Writer, header []string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
}

func printStats(w io.Writer, stats []operate.Stat) {
	rows := make([][]string, len(stats))
	for i, s := range stats {
		rows[i] = []string{text(s.EventType), text(s.State), fmt.Sprint(s.Count), when(s.Oldest)}
	}
	table(w, []string{"EVENT_TYPE", "STATE", "COUNT", "OLDEST"}, rows)
}

func printParked(w io.Writer, list []operate.EventSummary) {
	rows := make([][]string, len(list))
	for i, e := range list {
		rows[i] = []string{e.EventID.String(), text(e.EventType), text(e.AggregateID), fmt.Sprint(e.AggregateVersion),
			fmt.Sprint(e.Attempts), text(e.ErrorClass), text(e.LastError)}
	}
	table(w, []string{"EVENT_ID", "EVENT_TYPE", "AGGREGATE", "VERSION", "ATTEMPTS", "CLASS", "LAST_ERROR"}, rows)
}

// printEvent prints an event's fields, then its payload, audit trail and
// replays. A field that is unset (no error, not delivered) is left out.
func printEvent(w io.Writer, d operate.EventDetail) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	field := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	field("event_id", d.EventID.String())
	field("event_type", text(d.EventType))
	field("aggregate_type", text(d.AggregateType))
	field("aggregate_id", text(d.AggregateID))
	field("aggregate_version", fmt.Sprint(d.AggregateVersion))
	field("schema_version", fmt.Sprint(d.SchemaVersion))
	field("state", text(d.State))
	field("created_at", when(d.CreatedAt))
	field("attempts", fmt.Sprint(d.Attempts))
	if d.ErrorClass != "" {
		field("error_class", text(d.ErrorClass))
	}
	if d.LastError != "" {
		field("last_error", text(d.LastError))
	}
	if d.DeliveredAt != nil {
		field("delivered_at", when(*d.DeliveredAt))
	}
	if d.BrokerPartition != nil {
		field("broker_partition", numPtr(d.BrokerPartition))
	}
	if d.BrokerOffset != nil {
		field("broker_offset", numPtr(d.BrokerOffset))
	}
	if d.Archived {
		field("archived", "true")
	}
	_ = tw.Flush()
	if len(d.Payload) > 0 {
		var b bytes.Buffer
		if err := json.Indent(&b, d.Payload, "", "  "); err != nil {
			b.Reset()
			b.WriteString(adminguard.Printable(string(d.Payload)))
		}
		fmt.Fprintf(w, "payload:\n%s\n", b.Bytes())
	}
	if len(d.Audit) > 0 {
		fmt.Fprintln(w, "audit:")
		rows := make([][]string, len(d.Audit))
		for i, e := range d.Audit {
			rows[i] = []string{when(e.At), text(e.Actor), text(e.Action), text(e.Reason)}
		}
		table(w, []string{"AT", "ACTOR", "ACTION", "REASON"}, rows)
	}
	if len(d.Replays) > 0 {
		fmt.Fprintln(w, "replays:")
		rows := make([][]string, len(d.Replays))
		for i, r := range d.Replays {
			rows[i] = []string{r.PlanID.String(), text(r.PlannedBy), text(r.State), whenPtr(r.PublishedAt), numPtr(r.Offset)}
		}
		table(w, []string{"PLAN", "BY", "STATE", "PUBLISHED_AT", "OFFSET"}, rows)
	}
}

// printPlan prints a plan: who planned and approved it, where its run is,
// what it publishes and who will see it.
func printPlan(w io.Writer, p operate.ReplayPlan) {
	fmt.Fprintf(w, "plan %s: %s (planned by %s: %s)\n", p.ID, text(p.Status), text(p.CreatedBy), text(p.Reason))
	if p.NeedsApproval && p.ApprovedBy == "" {
		fmt.Fprintln(w, "needs the approval of a second admin: orders admin replay approve", p.ID, "--reason R")
	}
	if p.ApprovedBy != "" {
		fmt.Fprintf(w, "approved by %s (valid until %s)\n", text(p.ApprovedBy), whenPtr(p.ApprovalExpiresAt))
	}
	if p.RunOwner != "" {
		fmt.Fprintf(w, "run by %s (lease until %s)\n", text(p.RunOwner), whenPtr(p.RunLeaseExpiresAt))
	}
	fmt.Fprintf(w, "events to publish: %d (published: %d)\n", p.Events, p.Published)
	for _, t := range sortedKeys(p.Counts) {
		fmt.Fprintf(w, "  %-28s %d\n", text(t), p.Counts[t])
	}
	if len(p.Consumers) == 0 {
		fmt.Fprintln(w, "consumers: none known (REPLAY_CONSUMERS_FILE is not set, or no consumer reads these types)")
	}
	for _, c := range p.Consumers {
		fmt.Fprintf(w, "consumer %s: sees %d events, inbox retention %s\n", text(c.Name), c.Events, c.InboxRetention)
		for _, t := range sortedKeys(c.SideEffects) {
			fmt.Fprintf(w, "  side effect of %s: %s (absorbed while its inbox remembers the event)\n", text(t), text(c.SideEffects[t]))
		}
		for _, id := range c.TooOld {
			fmt.Fprintf(w, "  WARNING: event %s is older than %s's inbox retention: it may be applied again, side effects included\n",
				id, text(c.Name))
		}
	}
	for _, s := range p.Skipped {
		fmt.Fprintf(w, "skipped %s: %s\n", s.EventID, text(s.Reason))
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func printModes(w io.Writer, list []operate.ModeSetting) {
	rows := make([][]string, len(list))
	for i, m := range list {
		rows[i] = []string{text(m.EventType), text(string(m.Mode)), when(m.ChangedAt), text(m.ChangedBy)}
	}
	table(w, []string{"EVENT_TYPE", "MODE", "CHANGED_AT", "CHANGED_BY"}, rows)
}

func printShadowReport(w io.Writer, rep operate.ShadowReport) {
	fmt.Fprintf(w, "shadow comparisons of events sent since %s\n", when(rep.Since))
	rows := make([][]string, len(rep.Counts))
	for i, c := range rep.Counts {
		rows[i] = []string{text(c.EventType), text(c.Result), fmt.Sprint(c.Count)}
	}
	table(w, []string{"EVENT_TYPE", "RESULT", "COUNT"}, rows)
	if len(rep.Diffs) > 0 {
		fmt.Fprintln(w, "\nlatest differences:")
		rows := make([][]string, len(rep.Diffs))
		for i, d := range rep.Diffs {
			rows[i] = []string{d.EventID.String(), text(d.EventType), when(d.SentAt), text(d.Result), text(d.Detail)}
		}
		table(w, []string{"EVENT_ID", "EVENT_TYPE", "SENT_AT", "RESULT", "DETAIL"}, rows)
	}
}
