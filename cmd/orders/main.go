// Command orders runs the order service: the HTTP API that writes orders and
// their outbox events in one transaction, and the embedded outbox relay that
// delivers those events to Kafka.
//
//	orders migrate [status]  create the database if needed and apply the
//	                         outbox and orders migration lines, or list them
//	orders serve             run the API (and the relay unless RELAY_ENABLED=false)
//	orders relay             run the relay alone, to scale it apart from the API
//	orders admin …           operate the outbox: parked events, repair, resume, replay
//	orders healthcheck       exit 0 if `orders serve` here answers /readyz (for images without curl)
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/gcdefaults"
	"github.com/outboxref/orders/internal/healthcheck"
	"github.com/outboxref/orders/internal/migrate"
)

func main() {
	gcdefaults.Apply(os.Getenv)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

const usage = `usage: orders <command>

commands:
  migrate         create the database if needed and apply migrations (idempotent)
  migrate status  list each migration line's files and whether they are applied
  serve           run the HTTP API and, unless RELAY_ENABLED=false, the outbox relay
  relay           run only the outbox relay
  admin ...       operate the outbox through the admin API (orders admin help)
  healthcheck     probe /readyz of the API on HTTP_ADDR; exit 0 when ready
  help            show this text
`

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stdout, usage)
		return fmt.Errorf("expected a command")
	}
	if args[0] != "migrate" && args[0] != "admin" && len(args) != 1 {
		fmt.Fprint(stdout, usage)
		return fmt.Errorf("%s takes no arguments", args[0])
	}
	switch args[0] {
	case "migrate":
		return runMigrate(ctx, args[1:], getenv, stdout)
	case "serve":
		return runServe(ctx, getenv, stdout)
	case "relay":
		return runRelayOnly(ctx, getenv, stdout)
	case "admin":
		return runAdmin(ctx, args[1:], getenv, stdout)
	case "healthcheck":
		return healthcheck.Run(ctx, loadHealthcheckConfig(getenv), "/readyz", stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stdout, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
}

func runMigrate(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	return migrate.Command(ctx, args, loadMigrateConfig(getenv), schema.Orders(), stdout)
}
