package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/orders/internal/notify"
	"github.com/outboxref/orders/internal/notify/notifydb"
)

func openDB(ctx context.Context, getenv func(string) string) (*pgxpool.Pool, error) {
	url := getenv("DATABASE_URL")
	if url == "" {
		url = defaultDatabaseURL
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %w", err)
	}
	return pool, nil
}

// stderr receives the deprecation notices of the old commands, so their
// stdout stays what scripts parse.
var stderr io.Writer = os.Stderr

// runEmails lists ledger rows in one state, for the operator who resolves
// unknown or failed emails. It prints identifiers and errors, not bodies.
//
// Deprecated: `notifier admin emails` does the same through the admin API,
// with a token instead of the database's credentials. This alias stays so
// that scripts keep working.
func runEmails(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fmt.Fprintln(stderr, "notifier: `notifier emails` is deprecated; use `notifier admin emails [STATE]` (the admin API, with ADMIN_API_TOKEN)")
	state := notify.StateUnknown
	if len(args) > 0 {
		state = args[0]
	}
	pool, err := openDB(ctx, getenv)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := notifydb.New(pool).EmailSendListByState(ctx, notifydb.EmailSendListByStateParams{State: state, RowLimit: 500})
	if err != nil {
		return fmt.Errorf("list emails: %w", err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "OPERATION_KEY\tEVENT_ID\tEVENT_TYPE\tORDER_ID\tSTATE\tATTEMPTS\tCREATED_AT\tREASON")
	for _, r := range rows {
		// Why the row is in this state: the skip reason, else the last error.
		reason := ""
		switch {
		case r.SkipReason != nil:
			reason = *r.SkipReason
		case r.LastError != nil:
			reason = *r.LastError
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.OperationKey, r.EventID, r.EventType, r.OrderID, r.State, r.Attempts,
			r.CreatedAt.UTC().Format("2006-01-02T15:04:05Z"), reason)
	}
	return tw.Flush()
}

// legacyReason is the audit trail's reason for a resolution made with the
// deprecated command, which takes none.
const legacyReason = "via the deprecated `notifier resolve-email` command, which takes no reason"

// runResolveEmail records an operator's decision about an unknown or
// failed email (the hold policy's way out), with the actor.
//
// Deprecated: `notifier admin resolve-email KEY RESOLUTION --reason R`
// does it through the admin API, the actor being the token's subject. This
// alias stays so that scripts keep working; it writes the same audit row,
// with the ACTOR it is given and a reason saying no reason was given.
func runResolveEmail(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fmt.Fprintln(stderr, "notifier: `notifier resolve-email` is deprecated; use `notifier admin resolve-email KEY sent|resend|failed --reason R` (the admin API, with ADMIN_API_TOKEN)")
	if len(args) != 3 {
		return fmt.Errorf("usage: notifier resolve-email OPERATION_KEY sent|resend|failed ACTOR")
	}
	pool, err := openDB(ctx, getenv)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := notify.NewAdmin(notify.AdminConfig{Pool: pool}).ResolveEmail(ctx, args[0], args[1], args[2], legacyReason); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "resolve-email: %s marked %s by %s\n", args[0], args[1], args[2])
	return nil
}
