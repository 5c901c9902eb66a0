package inbox_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/inbox"
)

// TestSelfContained: the inbox is copied into other services with its
// directory and one import-path change, so it may import nothing of this
// module but itself and the record format it reads (the outbox's
// cloudevents package, which a consumer copies along).
func TestSelfContained(t *testing.T) {
	t.Parallel()
	// The module of this package, not `go list -m`, which lists every
	// module of a go.work workspace and would match nothing.
	mod, err := exec.Command("go", "list", "-f", "{{.Module.Path}}", ".").Output()
	require.NoError(t, err)
	module := strings.TrimSpace(string(mod))
	require.NotEmpty(t, module)
	require.NotContains(t, module, "\n")
	deps, err := exec.Command("go", "list", "-deps", "-test", "-f", "{{.ImportPath}}", ".").Output()
	require.NoError(t, err)
	allowed := []string{module + "/internal/inbox", module + "/internal/outbox/cloudevents"}
	for _, dep := range strings.Fields(string(deps)) {
		dep = strings.Fields(strings.NewReplacer("[", " ", "]", " ").Replace(dep))[0]
		if dep != module && !strings.HasPrefix(dep, module+"/") {
			continue
		}
		ok := false
		for _, a := range allowed {
			// The package itself, its sub-packages, and its test packages
			// (inbox_test, inbox.test).
			ok = ok || dep == a || strings.HasPrefix(dep, a+"/") || strings.HasPrefix(dep, a+".") || strings.HasPrefix(dep, a+"_")
		}
		require.True(t, ok, "the inbox depends on %s, which a service copying it would not have", dep)
	}
}

// TestPublicAPINamesNoGeneratedCode: a service calls the inbox through its
// own types, so that regenerating the queries (or replacing sqlc) never
// changes what callers compile against. The documented API must not name
// the generated package, not even through an alias.
func TestPublicAPINamesNoGeneratedCode(t *testing.T) {
	t.Parallel()
	doc, err := exec.Command("go", "doc", "-all", ".").Output()
	require.NoError(t, err)
	require.NotContains(t, string(doc), "inboxdb.", "the inbox's exported API exposes its generated code")
}

// What DBTX promises: a pool, a connection and a transaction all satisfy it.
var (
	_ inbox.DBTX = (*pgxpool.Pool)(nil)
	_ inbox.DBTX = (*pgx.Conn)(nil)
	_ inbox.DBTX = pgx.Tx(nil)
)
