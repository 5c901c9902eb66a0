// Command notifier runs the order notifier: the consumer that turns order
// events into customer emails exactly once per event, with its own
// database (inbox, order projection, email send ledger).
//
//	notifier migrate [status]        create the database if needed and apply the
//	                                 inbox and notifier migration lines, or list them
//	notifier serve                   consume, send emails, serve /healthz, /readyz, /metrics
//	notifier emails [STATE]          list send-ledger rows (default: unknown)
//	notifier resolve-email KEY RESOLUTION ACTOR
//	                                 resolve an unknown or failed email: sent, resend or failed
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxref/orders/db/migrations"
	"github.com/outboxref/orders/internal/healthcheck"
	"github.com/outboxref/orders/internal/migrate"
)

func main() {
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
  serve                          consume order events, send emails, serve /healthz /readyz /metrics
  emails [STATE]                 list send-ledger rows in STATE (default unknown; also skipped, failed, ...)
  resolve-email KEY RES ACTOR    resolve an unknown or failed email; RES is sent, resend or failed
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
	case "emails":
		return runEmails(ctx, args[1:], getenv, stdout)
	case "resolve-email":
		return runResolveEmail(ctx, args[1:], getenv, stdout)
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
	return migrate.Command(ctx, args, loadMigrateConfig(getenv), migrations.Notifier(), stdout)
}
