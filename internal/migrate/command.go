package migrate

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Command runs the `migrate` subcommand of a service binary: with no
// arguments it applies every line (`<binary> migrate`), with "status" it
// lists each line's files and whether they are applied.
func Command(ctx context.Context, args []string, databaseURL string, lines []Line, stdout io.Writer) error {
	switch {
	case len(args) == 0 || (len(args) == 1 && args[0] == "up"):
		applied, err := Up(ctx, databaseURL, lines...)
		for _, a := range applied {
			fmt.Fprintf(stdout, "migrate: applied %s (%s)\n", a, a.Duration.Round(1e6))
		}
		if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		names := make([]string, len(lines))
		for i, l := range lines {
			names[i] = l.Name
		}
		fmt.Fprintf(stdout, "migrate: %d applied; lines %s are up to date\n", len(applied), strings.Join(names, ", "))
		return nil
	case len(args) == 1 && args[0] == "status":
		st, err := Status(ctx, databaseURL, lines...)
		if err != nil {
			return fmt.Errorf("migrate status: %w", err)
		}
		PrintStatus(stdout, st)
		return nil
	default:
		return fmt.Errorf("usage: migrate [up|status]")
	}
}

// PrintStatus writes one table row per migration file.
func PrintStatus(w io.Writer, st []LineStatus) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LINE\tVERSION\tFILE\tSTATE\tAPPLIED_AT")
	for _, l := range st {
		for _, f := range l.Files {
			state, at := "pending", ""
			if f.Applied {
				state, at = "applied", f.AppliedAt.UTC().Format("2006-01-02T15:04:05Z")
			}
			if f.Edited {
				state = "applied, EDITED since"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", l.Line, f.Version, f.File, state, at)
		}
		for _, v := range l.Unknown {
			fmt.Fprintf(tw, "%s\t%d\t(not in this binary)\tapplied by a newer binary\t\n", l.Line, v)
		}
	}
	_ = tw.Flush()
}
