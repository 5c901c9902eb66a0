package orders_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestImportsOnlyTheWriteSide: the domain writes its events with package
// outbox and nothing more. The relay and the operations belong to the
// process that runs them (cmd/orders wires both), so a change that pulls
// either into the domain, from its code or its tests, fails here.
func TestImportsOnlyTheWriteSide(t *testing.T) {
	t.Parallel()
	goCmd, err := exec.LookPath("go")
	require.NoError(t, err, "the go command is needed to list imports")
	out, err := exec.Command(goCmd, "list", "-deps", "-test", ".").Output()
	require.NoError(t, err)
	const unit = "github.com/outboxref/orders/internal/outbox"
	for _, pkg := range strings.Fields(string(out)) {
		for _, side := range []string{unit + "/relay", unit + "/operate"} {
			require.False(t, pkg == side || strings.HasPrefix(pkg, side+"/"),
				"internal/orders depends on %s; only the write side, %s, belongs in the domain", pkg, unit)
		}
	}
}
