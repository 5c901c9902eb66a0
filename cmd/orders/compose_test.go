package main

import (
	"testing"

	"github.com/outboxref/orders/internal/composetest"
)

// TestComposeEnvironment checks the services of compose.yaml that run
// orders: every variable set for them is one that orders reads, as
// recorded from its own config loaders, and the values pass validation.
// A renamed variable left behind in compose.yaml fails here.
func TestComposeEnvironment(t *testing.T) {
	t.Parallel()
	composetest.CheckEnvironment(t, "orders", map[string]composetest.Loader{
		"migrate":     func(getenv func(string) string) error { loadMigrateConfig(getenv); return nil },
		"serve":       func(getenv func(string) string) error { _, err := loadConfig(getenv); return err },
		"relay":       func(getenv func(string) string) error { _, err := loadRelayConfig(getenv); return err },
		"healthcheck": func(getenv func(string) string) error { loadHealthcheckConfig(getenv); return nil },
	})
}
