package e2e

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestMonitoringMatchesTheServices loads the alert rules with Prometheus'
// own rule parser, and checks that every metric named in the rules and in
// the Grafana dashboard is one that a live orders and a live notifier
// export. A renamed metric would otherwise leave an alert silent for ever.
func TestMonitoringMatchesTheServices(t *testing.T) {
	t.Parallel()
	p := parser.NewParser(parser.Options{})
	groups, errs := rulefmt.ParseFile(filepath.Join("..", "deploy", "prometheus", "alerts.yml"), false, model.UTF8Validation, p,
		slog.New(slog.DiscardHandler))
	require.Empty(t, errs, "alerts.yml must load in Prometheus")
	var exprs []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	require.NotEmpty(t, exprs)

	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	b, err := os.ReadFile(filepath.Join("..", "deploy", "grafana", "dashboards", "outboxref.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &dash))
	for _, panel := range dash.Panels {
		require.NotEmpty(t, panel.Targets, "panel %q", panel.Title)
		for _, tgt := range panel.Targets {
			exprs = append(exprs, tgt.Expr)
		}
	}

	// Prometheus loads the rules from the path prometheus.yml names.
	var promCfg struct {
		RuleFiles []string `yaml:"rule_files"`
	}
	b, err = os.ReadFile(filepath.Join("..", "deploy", "prometheus", "prometheus.yml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &promCfg))
	require.Equal(t, []string{"/etc/prometheus/alerts.yml"}, promCfg.RuleFiles)

	used := map[string]bool{}
	for _, e := range exprs {
		ast, err := p.ParseExpr(e)
		require.NoError(t, err, "%s", e)
		parser.Inspect(ast, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				used[vs.Name] = true
			}
			return nil
		})
	}

	// A live chain: one order through orders and the notifier, so that the
	// metrics that only appear with traffic appear.
	c := newChain(t)
	notifier := start(t, "notifier", c.notifierEnv(nil), "serve")
	waitReady(t, notifier, "http://"+c.notifierAddr+"/readyz")
	c.traffic(t)
	exported := map[string]bool{}
	require.Eventually(t, func() bool {
		for _, url := range []string{"http://" + c.ordersAddr + "/metrics", "http://" + c.notifierAddr + "/metrics"} {
			for name := range metricNames(t, url) {
				exported[name] = true
			}
		}
		return exported["notifier_consumer_lag"] && exported["notifier_consume_latency_seconds_bucket"]
	}, 30*time.Second, 200*time.Millisecond, "the notifier has consumed and measured its lag")

	var missing []string
	for name := range used {
		if !exported[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	require.Empty(t, missing, "metrics used by alerts.yml or the dashboard that no service exports")
	t.Logf("%d metric names used by %d expressions, all exported", len(used), len(exprs))
}

// metricNames lists the series names of a Prometheus text exposition.
func metricNames(t *testing.T, url string) map[string]bool {
	t.Helper()
	res, err := http.Get(url)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	out := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		out[name] = true
	}
	return out
}
