package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/console"
	"github.com/outboxref/orders/internal/envconfig"
	"github.com/outboxref/orders/internal/notifyapi"
	"github.com/outboxref/orders/internal/orders"
)

// ConsoleConfig is the operator console served at /console (see
// internal/console).
type ConsoleConfig struct {
	// ReadOnly hides every write control and refuses every write.
	ReadOnly bool // CONSOLE_READ_ONLY
	// NotifierURL and NotifierToken reach the notifier's admin API (an
	// admin token of the notifier's AUTH_TOKENS); without them the
	// notifier's parts of the console say it is not configured.
	NotifierURL   string // CONSOLE_NOTIFIER_URL
	NotifierToken string // CONSOLE_NOTIFIER_TOKEN
	// ConsumerGroups are the groups whose lag per partition the overview
	// shows, read from the broker.
	ConsumerGroups []string // CONSOLE_CONSUMER_GROUPS
	MailpitURL     string   // CONSOLE_MAILPIT_URL: links to the demo's SMTP sink
	TraceURL       string   // CONSOLE_TRACE_URL: a trace's page, with {trace_id}
	GrafanaURL     string   // CONSOLE_GRAFANA_URL
	SessionTTL     time.Duration
}

func loadConsole(r *envconfig.Reader) ConsoleConfig {
	c := ConsoleConfig{
		ReadOnly:       r.Bool("CONSOLE_READ_ONLY", false),
		NotifierURL:    strings.TrimRight(r.String("CONSOLE_NOTIFIER_URL", ""), "/"),
		NotifierToken:  r.String("CONSOLE_NOTIFIER_TOKEN", ""),
		ConsumerGroups: r.List("CONSOLE_CONSUMER_GROUPS", "notifier"),
		MailpitURL:     r.String("CONSOLE_MAILPIT_URL", ""),
		TraceURL:       r.String("CONSOLE_TRACE_URL", ""),
		GrafanaURL:     r.String("CONSOLE_GRAFANA_URL", ""),
		SessionTTL:     r.Duration("CONSOLE_SESSION_TTL", console.DefaultSessionTTL),
	}
	for name, v := range map[string]string{"CONSOLE_NOTIFIER_URL": c.NotifierURL, "CONSOLE_MAILPIT_URL": c.MailpitURL,
		"CONSOLE_TRACE_URL": c.TraceURL, "CONSOLE_GRAFANA_URL": c.GrafanaURL} {
		if u, err := url.Parse(v); v != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
			r.Fail("%s=%q: want an http(s) URL", name, v)
		}
	}
	if (c.NotifierURL == "") != (c.NotifierToken == "") {
		r.Fail("CONSOLE_NOTIFIER_URL and CONSOLE_NOTIFIER_TOKEN go together: set both, or neither")
	}
	if c.TraceURL != "" && !strings.Contains(c.TraceURL, "{trace_id}") {
		r.Fail("CONSOLE_TRACE_URL=%q: want a URL with {trace_id} in it", c.TraceURL)
	}
	if c.SessionTTL <= 0 {
		r.Fail("CONSOLE_SESSION_TTL must be positive")
	}
	return c
}

func (c ConsoleConfig) print(w io.Writer) {
	fmt.Fprintf(w, "config: CONSOLE_READ_ONLY=%t CONSOLE_NOTIFIER_URL=%s CONSOLE_NOTIFIER_TOKEN=%s CONSOLE_CONSUMER_GROUPS=%s CONSOLE_MAILPIT_URL=%s CONSOLE_TRACE_URL=%s CONSOLE_GRAFANA_URL=%s CONSOLE_SESSION_TTL=%s\n",
		c.ReadOnly, c.NotifierURL, envconfig.Mask(c.NotifierToken), strings.Join(c.ConsumerGroups, ","), c.MailpitURL, c.TraceURL, c.GrafanaURL, c.SessionTTL)
}

// newConsole builds the console over the operations: the same Admin,
// replay policy and producer as the admin API, so its writes are audited
// the same way.
func newConsole(ctx context.Context, cfg Config, tokens *auth.Tokens, ops *operations, log *slog.Logger) *console.Console {
	cc := console.Config{
		Admin: ops.admin, Policy: ops.policy, Target: ops.replayTarget, Background: ctx,
		Tokens: tokens, AggregateType: orders.AggregateType, ReadOnly: cfg.Console.ReadOnly,
		MailpitURL: cfg.Console.MailpitURL, TraceURL: cfg.Console.TraceURL, GrafanaURL: cfg.Console.GrafanaURL,
		SessionTTL: cfg.Console.SessionTTL, Log: log,
	}
	if cfg.Console.NotifierURL != "" {
		cc.Notifier = notifyapi.NewClient(cfg.Console.NotifierURL, cfg.Console.NotifierToken)
	}
	if len(cfg.Console.ConsumerGroups) > 0 {
		groups := cfg.Console.ConsumerGroups
		cc.Lag = func(ctx context.Context) ([]console.PartitionLag, error) {
			cl, err := ops.client()
			if err != nil {
				return nil, err
			}
			ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			lags, err := kadm.NewClient(cl).Lag(ctx, groups...)
			if err != nil {
				return nil, err
			}
			var out []console.PartitionLag
			for _, g := range lags.Sorted() {
				if err := g.Error(); err != nil {
					return nil, fmt.Errorf("group %s: %w", g.Group, err)
				}
				for _, l := range g.Lag.Sorted() {
					out = append(out, console.PartitionLag{Group: g.Group, Topic: l.Topic, Partition: l.Partition,
						Committed: l.Commit.At, End: l.End.Offset, Lag: l.Lag})
				}
			}
			return out, nil
		}
	}
	return console.New(cc)
}

// withConsole serves the console under /console/ and everything else with
// api. A prefix test, not a ServeMux: a mux would clean and redirect paths
// before the API's own checks see them.
func withConsole(api http.Handler, c http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/console/"):
			c.ServeHTTP(w, r)
		case r.URL.Path == "/console":
			http.Redirect(w, r, "/console/overview", http.StatusSeeOther)
		default:
			api.ServeHTTP(w, r)
		}
	})
}
