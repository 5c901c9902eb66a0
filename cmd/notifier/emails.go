package main

import (
	"context"
	"fmt"
	"io"
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

// runEmails lists ledger rows in one state, for the operator who resolves
// unknown or failed emails. It prints identifiers and errors, not bodies.
func runEmails(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
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

// runResolveEmail records an operator's decision about an unknown or
// failed email (the hold policy's way out), with the actor.
func runResolveEmail(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) != 3 {
		return fmt.Errorf("usage: notifier resolve-email OPERATION_KEY sent|resend|failed ACTOR")
	}
	pool, err := openDB(ctx, getenv)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := notify.ResolveEmail(ctx, pool, args[0], args[1], args[2]); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "resolve-email: %s marked %s by %s\n", args[0], args[1], args[2])
	return nil
}
