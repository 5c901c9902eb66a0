package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/composetest"
)

// TestComposeEnvironment checks the services of compose.yaml that run the
// notifier: every variable set for them is one that the notifier reads, as
// recorded from its own config loaders, and the values pass validation.
// A renamed variable left behind in compose.yaml fails here.
func TestComposeEnvironment(t *testing.T) {
	t.Parallel()
	composetest.CheckEnvironment(t, "notifier", map[string]composetest.Loader{
		"migrate":     func(getenv func(string) string) error { loadMigrateConfig(getenv); return nil },
		"serve":       func(getenv func(string) string) error { _, err := loadConfig(getenv); return err },
		"healthcheck": func(getenv func(string) string) error { loadHealthcheckConfig(getenv); return nil },
	})
}

// TestComposeScales: `docker compose up --scale notifier=2` starts replicas
// with one environment, so a fixed KAFKA_INSTANCE_ID would give two group
// members the same static identity, and the broker would fence one of them.
func TestComposeScales(t *testing.T) {
	t.Parallel()
	for _, inv := range composetest.Invocations(t, composetest.Load(t)) {
		if inv.Binary == "notifier" && inv.Role == "command" {
			require.NotContains(t, inv.Env, "KAFKA_INSTANCE_ID", "service %s", inv.Service)
		}
	}
}
