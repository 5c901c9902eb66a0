package relay_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRelaysShareThePartitions (R1, R9): a relay alone owns every
// partition; a second relay that starts counts as live at once, so the
// first gives back what is above its fair share and the second takes it;
// when the first stops, it gives its partitions back and the second takes
// them at once, well before their leases would have expired.
func TestRelaysShareThePartitions(t *testing.T) {
	t.Parallel()
	const all = 16
	e := setup(t)
	first := start(t, e.relay(t, func(c *relayConfig) {
		c.Owner = "first"
		c.Lease = time.Minute
	}))
	require.Eventually(t, func() bool { return e.owned(t, "first") == all }, 10*time.Second, 20*time.Millisecond,
		"a relay alone owns every partition")

	start(t, e.relay(t, func(c *relayConfig) {
		c.Owner = "second"
		c.Lease = time.Minute
	}))
	require.Eventually(t, func() bool { return e.owned(t, "first") == all/2 && e.owned(t, "second") == all/2 },
		10*time.Second, 20*time.Millisecond, "two relays own half each")

	stopping := time.Now()
	require.NoError(t, first.Stop(t))
	require.Zero(t, e.owned(t, "first"), "a stopped relay gives every partition back")
	require.Eventually(t, func() bool { return e.owned(t, "second") == all }, 10*time.Second, 20*time.Millisecond,
		"the remaining relay takes them")
	require.Less(t, time.Since(stopping), 30*time.Second, "without waiting for the leases to expire")
}
