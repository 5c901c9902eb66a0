package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/orders/internal/envconfig"
	"github.com/outboxref/orders/internal/notifyapi"
	"github.com/outboxref/orders/internal/outbox/adminguard"
)

const adminUsage = `usage: notifier admin <command> [--json]

A client of the admin API of a running notifier (ADMIN_API_URL, default
http://127.0.0.1:8081; ADMIN_API_TOKEN, an admin-role token of its AUTH_TOKENS).
Tables by default, the API's JSON with --json. Writes need --reason, which
goes to the audit trail with the token's subject.

commands:
  parked [--all] [--after ID] [--limit N]       parked records (open ones unless --all) and held events parked
  parked show ID                                one parked record: headers, key and value
  conflicts [--limit N]                         events that claimed a version another owns, and the verdict
  held [--limit N]                              events waiting for an earlier version of their order
  held drop EVENT_ID --reason R                 take a held event out of its order's sequence for good
  retry ID --reason R                           decode and process a parked record again, now
  emails [STATE] [--limit N]                    send-ledger rows in STATE (default unknown)
  resolve-email KEY sent|resend|failed --reason R
                                                resolve an unknown or failed email
`

// adminClientConfig is where `notifier admin` finds the API.
type adminClientConfig struct {
	URL   string // ADMIN_API_URL
	Token string // ADMIN_API_TOKEN
}

const defaultAdminAPIURL = "http://127.0.0.1:8081"

func loadAdminClientConfig(getenv func(string) string) (adminClientConfig, error) {
	r := envconfig.New(getenv)
	c := adminClientConfig{URL: r.String("ADMIN_API_URL", defaultAdminAPIURL), Token: r.String("ADMIN_API_TOKEN", "")}
	if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		r.Fail("ADMIN_API_URL=%q: want the notifier's http(s) URL, such as %s", c.URL, defaultAdminAPIURL)
	}
	if c.Token == "" {
		r.Fail("ADMIN_API_TOKEN is required: a token of the notifier's AUTH_TOKENS with the admin role")
	}
	if err := r.Err(); err != nil {
		return adminClientConfig{}, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return c, nil
}

// adminArgs are a command line's positional arguments and flags. Flags may
// come anywhere (`retry 12 --reason "..."`).
type adminArgs struct {
	pos    []string
	json   bool
	all    bool
	reason *string
	after  int64
	limit  int
}

func parseAdminArgs(args []string) (adminArgs, error) {
	var a adminArgs
	for i := 0; i < len(args); i++ {
		name, value, hasValue := strings.Cut(args[i], "=")
		if !strings.HasPrefix(name, "-") || name == "-" {
			a.pos = append(a.pos, args[i])
			continue
		}
		name = "--" + strings.TrimLeft(name, "-")
		takeValue := func() (string, error) {
			if hasValue {
				return value, nil
			}
			if i+1 >= len(args) {
				return "", fmt.Errorf("%s needs a value", name)
			}
			i++
			return args[i], nil
		}
		switch name {
		case "--json":
			a.json = true
		case "--all":
			a.all = true
		case "--reason":
			v, err := takeValue()
			if err != nil {
				return a, err
			}
			a.reason = &v
		case "--after", "--limit":
			v, err := takeValue()
			if err != nil {
				return a, err
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return a, fmt.Errorf("%s %q: want a non-negative integer", name, v)
			}
			if name == "--after" {
				a.after = n
			} else {
				a.limit = int(n)
			}
		default:
			return a, fmt.Errorf("unknown flag %s", name)
		}
	}
	return a, nil
}

// runAdmin is `notifier admin …`: a thin client of the admin API.
func runAdmin(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	a, err := parseAdminArgs(args)
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	if len(a.pos) == 0 || a.pos[0] == "help" {
		fmt.Fprint(stdout, adminUsage)
		if len(a.pos) == 0 {
			return errors.New("admin: expected a command")
		}
		return nil
	}
	cfg, err := loadAdminClientConfig(getenv)
	if err != nil {
		return err
	}
	c := notifyapi.NewClient(cfg.URL, cfg.Token)
	cmd, rest := a.pos[0], a.pos[1:]
	want := func(n int, usage string) error {
		if len(rest) != n {
			return fmt.Errorf("admin %s: usage: notifier admin %s", cmd, usage)
		}
		return nil
	}
	reason := func(usage string) (string, error) {
		if a.reason == nil || strings.TrimSpace(*a.reason) == "" {
			return "", fmt.Errorf("admin %s: --reason is required (it goes to the audit trail): usage: notifier admin %s", cmd, usage)
		}
		// The server's rule, checked before sending, in the server's words.
		if err := adminguard.CheckReason(*a.reason); err != nil {
			return "", fmt.Errorf("admin %s: --reason: %w", cmd, err)
		}
		return *a.reason, nil
	}
	switch {
	case cmd == "parked" && len(rest) > 0 && rest[0] == "show":
		rest = rest[1:]
		if err := want(1, "parked show ID"); err != nil {
			return err
		}
		id, err := parkedID(rest[0])
		if err != nil {
			return err
		}
		p, err := c.ParkedRecord(ctx, id)
		if err != nil {
			return fmt.Errorf("admin parked show %d: %w", id, err)
		}
		return output(stdout, a.json, p, func(w io.Writer) { printParkedRecord(w, p) })

	case cmd == "parked":
		if err := want(0, "parked [--all] [--after ID] [--limit N]"); err != nil {
			return err
		}
		list, err := c.Parked(ctx, notifyapi.ParkedQuery{After: a.after, Limit: a.limit, All: a.all})
		if err != nil {
			return fmt.Errorf("admin parked: %w", err)
		}
		return output(stdout, a.json, list, func(w io.Writer) { printParked(w, list) })

	case cmd == "held" && len(rest) > 0 && rest[0] == "drop":
		rest = rest[1:]
		const usage = "held drop EVENT_ID --reason R"
		if err := want(1, usage); err != nil {
			return err
		}
		id, err := uuid.Parse(rest[0])
		if err != nil {
			return fmt.Errorf("admin held drop: %q is not an event id", rest[0])
		}
		why, err := reason(usage)
		if err != nil {
			return err
		}
		res, err := c.DropHeld(ctx, id, why)
		if err != nil {
			return fmt.Errorf("admin held drop %s: %w", id, err)
		}
		return output(stdout, a.json, res, func(w io.Writer) {
			fmt.Fprintf(w, "held drop: %s (%s v%d of %s) dropped (audit %d)\n", res.EventID, safe(res.EventType), res.AggregateVersion, safe(res.AggregateID), res.AuditID)
		})

	case cmd == "held":
		if err := want(0, "held [--limit N]"); err != nil {
			return err
		}
		list, err := c.Held(ctx, a.limit)
		if err != nil {
			return fmt.Errorf("admin held: %w", err)
		}
		return output(stdout, a.json, list, func(w io.Writer) {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "EVENT_ID\tAGGREGATE\tVERSION\tEVENT_TYPE\tHELD_AT")
			for _, e := range list.Events {
				fmt.Fprintf(tw, "%s\t%s/%s\t%d\t%s\t%s\n", e.EventID, safe(e.AggregateType), safe(e.AggregateID), e.AggregateVersion, safe(e.EventType), when(e.HeldAt))
			}
			_ = tw.Flush()
		})

	case cmd == "conflicts":
		if err := want(0, "conflicts [--limit N]"); err != nil {
			return err
		}
		list, err := c.Conflicts(ctx, a.limit)
		if err != nil {
			return fmt.Errorf("admin conflicts: %w", err)
		}
		return output(stdout, a.json, list, func(w io.Writer) { printConflicts(w, list) })

	case cmd == "retry":
		const usage = "retry ID --reason R"
		if err := want(1, usage); err != nil {
			return err
		}
		id, err := parkedID(rest[0])
		if err != nil {
			return err
		}
		why, err := reason(usage)
		if err != nil {
			return err
		}
		res, err := c.Retry(ctx, id, why)
		if err != nil {
			return fmt.Errorf("admin retry %d: %w", id, err)
		}
		if err := output(stdout, a.json, res, func(w io.Writer) { printRetry(w, res) }); err != nil {
			return err
		}
		if res.Resolution == "still_failing" {
			// A script must be able to tell; the record stays parked.
			return fmt.Errorf("admin retry %d: still failing, still parked: %s", id, res.Error)
		}
		return nil

	case cmd == "emails":
		if len(rest) > 1 {
			return errors.New("admin emails: usage: notifier admin emails [STATE] [--limit N]")
		}
		state := ""
		if len(rest) == 1 {
			state = rest[0]
		}
		list, err := c.Emails(ctx, state, a.limit)
		if err != nil {
			return fmt.Errorf("admin emails: %w", err)
		}
		return output(stdout, a.json, list, func(w io.Writer) { printEmails(w, list.Emails) })

	case cmd == "resolve-email":
		const usage = "resolve-email KEY sent|resend|failed --reason R"
		if err := want(2, usage); err != nil {
			return err
		}
		why, err := reason(usage)
		if err != nil {
			return err
		}
		res, err := c.ResolveEmail(ctx, rest[0], rest[1], why)
		if err != nil {
			return fmt.Errorf("admin resolve-email %s: %w", rest[0], err)
		}
		return output(stdout, a.json, res, func(w io.Writer) {
			fmt.Fprintf(w, "resolve-email: %s marked %s by %s, now %s (audit %d)\n", res.Email.OperationKey, res.Resolution,
				res.Email.ResolvedBy, res.Email.State, res.AuditID)
		})

	default:
		fmt.Fprint(stdout, adminUsage)
		return fmt.Errorf("admin: unknown command %q", cmd)
	}
}

func parkedID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, fmt.Errorf("admin: %q is not a parked record id", s)
	}
	return id, nil
}

// output prints v as the API's JSON, or as text.
func output(w io.Writer, asJSON bool, v any, text func(io.Writer)) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	text(w)
	return nil
}

const timeLayout = "2006-01-02T15:04:05Z"

func when(t time.Time) string { return t.UTC().Format(timeLayout) }

func printParked(w io.Writer, list notifyapi.ParkedList) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPOSITION\tEVENT_ID\tPARKED_AT\tRESOLUTION\tRETRIES\tREASON")
	for _, p := range list.Records {
		eventID := "-"
		if p.EventID != nil {
			eventID = p.EventID.String()
		}
		resolution := "-"
		if p.Resolution != "" {
			resolution = p.Resolution
		}
		fmt.Fprintf(tw, "%d\t%s/%d@%d\t%s\t%s\t%s\t%d\t%s\n", p.ID, p.Topic, p.Partition, p.Offset, eventID, when(p.ParkedAt),
			resolution, p.Retries, safe(p.Reason))
	}
	_ = tw.Flush()
	if list.NextAfter != 0 {
		fmt.Fprintf(w, "more: notifier admin parked --after %d\n", list.NextAfter)
	}
	if len(list.Events) == 0 {
		return
	}
	fmt.Fprintln(w, "\nheld events parked or rejected:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT_ID\tAGGREGATE\tVERSION\tEVENT_TYPE\tHELD_AT\tSTATE\tREASON")
	for _, e := range list.Events {
		state := "parked"
		if e.Rejected {
			state = "rejected"
		}
		fmt.Fprintf(tw, "%s\t%s/%s\t%d\t%s\t%s\t%s\t%s\n", e.EventID, safe(e.AggregateType), safe(e.AggregateID), e.AggregateVersion,
			safe(e.EventType), when(e.HeldAt), state, safe(e.Reason))
	}
	_ = tw.Flush()
}

func printParkedRecord(w io.Writer, p notifyapi.ParkedRecord) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("id:", strconv.FormatInt(p.ID, 10))
	row("position:", fmt.Sprintf("%s/%d@%d", p.Topic, p.Partition, p.Offset))
	if p.EventID != nil {
		row("event_id:", p.EventID.String())
	}
	row("parked_at:", when(p.ParkedAt))
	row("reason:", safe(p.Reason))
	if p.Resolution != "" {
		row("resolution:", fmt.Sprintf("%s (outcome %s) by %s at %s: %s", p.Resolution, orDash(p.RetryOutcome), p.ResolvedBy,
			when(*p.ResolvedAt), safe(p.ResolutionNote)))
	}
	row("retries:", strconv.Itoa(p.Retries))
	row("key:", textOrBase64(p.Key, p.KeyBase64))
	_ = tw.Flush()
	fmt.Fprintln(w, "headers:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, h := range p.Headers {
		k := safe(h.Key)
		if h.KeyBase64 != nil {
			k = "base64:" + base64.StdEncoding.EncodeToString(h.KeyBase64)
		}
		v := strconv.Quote(h.Value)
		if h.ValueBase64 != nil {
			v = "base64:" + base64.StdEncoding.EncodeToString(h.ValueBase64)
		}
		fmt.Fprintf(tw, "  %s\t%s\n", k, v)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "value:")
	fmt.Fprintln(w, textOrBase64(p.Value, p.ValueBase64))
}

// safe prints text from the server (a parked record's key, value and
// reason come from whoever wrote to the topic) as one inert line: a
// control character is escaped, never sent to the terminal.
func safe(s string) string { return adminguard.Printable(s) }

// textOrBase64 prints a key or value the way the API sent it: text, or
// base64 marked as such.
func textOrBase64(text *string, b64 []byte) string {
	if text != nil {
		return safe(*text)
	}
	return "base64:" + base64.StdEncoding.EncodeToString(b64)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printConflicts(w io.Writer, list notifyapi.ConflictList) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT_ID\tAGGREGATE\tVERSION\tEVENT_TYPE\tEXISTING_EVENT_ID\tDETECTED_AT\tVERDICT")
	for _, c := range list.Conflicts {
		verdict := c.Resolution
		if verdict == "" {
			verdict = "pending"
		}
		fmt.Fprintf(tw, "%s\t%s/%s\t%d\t%s\t%s\t%s\t%s\n", c.EventID, safe(c.AggregateType), safe(c.AggregateID), c.AggregateVersion,
			safe(c.EventType), c.ExistingEventID, when(c.DetectedAt), safe(verdict))
	}
	_ = tw.Flush()
}

func printRetry(w io.Writer, r notifyapi.RetryResult) {
	switch r.Resolution {
	case "still_failing":
		fmt.Fprintf(w, "retry: parked record %d still fails and stays parked (audit %d): %s\n", r.ParkedRecord.ID, r.AuditID, safe(r.Error))
	default:
		fmt.Fprintf(w, "retry: parked record %d %s, inbox outcome %s (audit %d)\n", r.ParkedRecord.ID, r.Resolution, r.Outcome, r.AuditID)
	}
}

// printEmails prints ledger rows: identifiers and errors, never bodies.
func printEmails(w io.Writer, emails []notifyapi.Email) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "OPERATION_KEY\tEVENT_ID\tEVENT_TYPE\tORDER_ID\tSTATE\tATTEMPTS\tCREATED_AT\tREASON")
	for _, e := range emails {
		// Why the row is in this state: the skip reason, else the last error.
		reason := e.LastError
		if e.SkipReason != "" {
			reason = e.SkipReason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", e.OperationKey, e.EventID, e.EventType, e.OrderID, e.State, e.Attempts,
			when(e.CreatedAt), safe(reason))
	}
	_ = tw.Flush()
}
