package invoices_test

import (
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// serviceCode lists the parts of this module that belong to the order
// service and the notifier: their code, commands, migrations, queries and
// event schemas. Neither reusable package may depend on them (L1), nor may
// the example, which shows that a service can be built on the two packages
// alone (L3).
var serviceCode = []string{"internal/orders", "internal/ordersapi", "internal/notify", "cmd", "db", "docs"}

// TestReusablePackagesImportNoServiceCode checks from the outside what each
// package's own TestSelfContained checks from the inside: the packages the
// outbox, the inbox and this example need, their tests included, hold
// nothing of the order service or the notifier. It asks the go command, so
// it sees what a build sees.
func TestReusablePackagesImportNoServiceCode(t *testing.T) {
	t.Parallel()
	module := strings.TrimSpace(goList(t, "-m"))
	for _, pattern := range []string{"internal/outbox/...", "internal/inbox/...", "examples/invoices/..."} {
		deps := strings.Fields(goList(t, "-deps", "-test", "-f", "{{.ImportPath}}", module+"/"+pattern))
		require.NotEmpty(t, deps, pattern)
		require.Empty(t, serviceImports(module, deps), "%s depends on service code", pattern)
	}
}

// TestServiceImportsFindsViolations shows that the check above can fail.
func TestServiceImportsFindsViolations(t *testing.T) {
	t.Parallel()
	const m = "example.com/svc"
	deps := []string{
		"fmt", m + "/internal/outbox", m + "/internal/outbox [" + m + "/internal/outbox.test]",
		m + "/internal/ordersapi [" + m + "/internal/inbox.test]", m + "/internal/orders/ordersdb",
		m + "/cmd/notifier", m + "/internal/notifyish", m + "/db/schema",
	}
	require.Equal(t, []string{
		m + "/cmd/notifier", m + "/db/schema", m + "/internal/orders/ordersdb", m + "/internal/ordersapi",
	}, serviceImports(m, deps))
}

// variant matches the " [p.test]" suffix go list gives test variants.
var variant = regexp.MustCompile(` \[.*\]$`)

// serviceImports returns the packages among deps that are service code of
// module, sorted and without duplicates.
func serviceImports(module string, deps []string) []string {
	var found []string
	for _, dep := range deps {
		dep = variant.ReplaceAllString(dep, "")
		for _, dir := range serviceCode {
			root := module + "/" + dir
			if dep == root || strings.HasPrefix(dep, root+"/") {
				found = append(found, dep)
			}
		}
	}
	slices.Sort(found)
	return slices.Compact(found)
}

// goList runs go list with args and returns its output.
func goList(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list %s:\n%s", strings.Join(args, " "), stderr.String())
	return string(out)
}
