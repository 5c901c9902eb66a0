package invoices

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/outbox"
)

// MigrationLine names the service's own migration line. goose tracks each
// line in a version table of its own, <line>_migrations, so the outbox's
// and the inbox's files (each numbered from 1 in their packages) and the
// service's never collide, and adopting a newer outbox never renumbers the
// service's files.
const MigrationLine = "invoices"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLine is one goose line: numbered SQL files and the name of its
// version table.
type migrationLine struct {
	name  string
	files fs.FS
}

// lines returns the service's lines in the order they are applied: the
// packages' first, so that the service's own files may refer to their
// tables, then its own.
func lines() []migrationLine {
	own, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the directory is embedded at build time
	}
	return []migrationLine{
		{name: outbox.MigrationLine, files: outbox.Migrations()},
		{name: inbox.MigrationLine, files: inbox.Migrations()},
		{name: MigrationLine, files: own},
	}
}

// provider is goose for one line. goose's session lock (a PostgreSQL
// advisory lock) makes concurrent runs, e.g. several replicas starting at
// once, apply each file once.
func provider(pool *pgxpool.Pool, l migrationLine) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, stdlib.OpenDBFromPool(pool), l.files,
		goose.WithTableName(l.name+"_migrations"),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		return nil, fmt.Errorf("migration line %s: %w", l.name, err)
	}
	return p, nil
}

// Migrate applies every line to the database of pool, in order, and
// returns the files it applied as "line/file". It is idempotent: a database
// that is up to date gets nothing. Each file runs in a transaction of its
// own.
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	var applied []string
	for _, l := range lines() {
		files, err := up(ctx, pool, l)
		applied = append(applied, files...)
		if err != nil {
			return applied, err
		}
	}
	return applied, nil
}

func up(ctx context.Context, pool *pgxpool.Pool, l migrationLine) (applied []string, err error) {
	p, err := provider(pool, l)
	if err != nil {
		return nil, err
	}
	defer p.Close() // its *sql.DB only; the pool stays open
	results, err := p.Up(ctx)
	for _, r := range results {
		if r.Error == nil {
			applied = append(applied, l.name+"/"+path.Base(r.Source.Path))
		}
	}
	if err != nil {
		return applied, fmt.Errorf("apply migration line %s: %w", l.name, err)
	}
	return applied, nil
}

// MigrationState is one migration file and whether the database has it.
type MigrationState struct {
	Line      string
	File      string
	Version   int64
	Applied   bool
	AppliedAt time.Time
}

// MigrationStatus lists every file of every line, in the order Migrate
// applies them, and whether the database has it: what a service's
// "migrate status" command prints. Like goose's status, it takes the
// migration lock and creates a missing version table.
func MigrationStatus(ctx context.Context, pool *pgxpool.Pool) ([]MigrationState, error) {
	var out []MigrationState
	for _, l := range lines() {
		st, err := status(ctx, pool, l)
		if err != nil {
			return nil, err
		}
		out = append(out, st...)
	}
	return out, nil
}

func status(ctx context.Context, pool *pgxpool.Pool, l migrationLine) ([]MigrationState, error) {
	p, err := provider(pool, l)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("status of migration line %s: %w", l.name, err)
	}
	out := make([]MigrationState, 0, len(st))
	for _, m := range st {
		out = append(out, MigrationState{
			Line: l.name, File: path.Base(m.Source.Path), Version: m.Source.Version,
			Applied: m.State == goose.StateApplied, AppliedAt: m.AppliedAt,
		})
	}
	return out, nil
}
