// Command notifier runs the order notifier: the consumer that turns order
// events into customer emails exactly once per event, with its own
// database (inbox, order projection, email send ledger).
//
//	notifier migrate [status]        create the database if needed and apply the
//	                                 inbox and notifier migration lines, or list them
//	notifier serve                   consume, send emails, serve /healthz, /readyz, /metrics
//	                                 and the admin API under /admin (AUTH_TOKENS)
//	notifier admin COMMAND           a client of that admin API: parked records, conflicts,
//	                                 retries, the send ledger (ADMIN_API_URL, ADMIN_API_TOKEN)
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
		fmt.Fprintln(os.Stderr, "notifier:", err)
		os.Exit(1)
	}
}

const usage = `usage: notifier <command>

commands:
  migrate                        create the database if needed and apply migrations (idempotent)
  migrate status                 list each migration line's files and whether they are applied
  serve                          consume order events, send emails, serve /healthz /readyz /metrics and /admin
  admin COMMAND                  operate a running notifier through its admin API; notifier admin help
  healthcheck                    probe /readyz on HTTP_ADDR; exit 0 when ready
`

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stdout, usage)
		return fmt.Errorf("expected a command")
	}
	switch args[0] {
	case "migrate":
		return runMigrate(ctx, args[1:], getenv, stdout)
	case "serve":
		return runServe(ctx, getenv, stdout)
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
	return migrate.Command(ctx, args, loadMigrateConfig(getenv), schema.Notifier(), stdout)
}
