// Package migrate applies a service's migration lines to PostgreSQL with
// goose.
//
// A line is one sequence of numbered goose SQL files with a version table of
// its own (<name>_migrations). The reusable packages ship their own lines
// (outbox.Migrations, inbox.Migrations) and each service has one for its own
// tables, so a service applies, for example, the outbox line and the orders
// line, and each moves forward independently: adopting a new outbox version
// never renumbers the service's files, and the reverse.
//
// On top of goose this package adds what a service needs at start-up:
// creating the database when it is missing, refusing to run when an applied
// migration file was edited afterwards (a SHA-256 per applied file is kept
// in migration_checksums), and Check, which tells readiness whether the
// schema is behind what the binary needs. goose provides the rest: one
// transaction per migration (files marked "-- +goose NO TRANSACTION" run
// outside one, for CREATE INDEX CONCURRENTLY on a large table), the
// session-level advisory lock that makes concurrent first runs apply each
// file once, and the version tables that status reads.
package migrate

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"
)

// Line is one independently versioned sequence of migrations.
type Line struct {
	// Name identifies the line, e.g. "outbox". Its applied versions are
	// kept in the table <Name>_migrations.
	Name string
	// FS holds the line's goose SQL files (NNNNN_description.sql) at its
	// root.
	FS fs.FS
}

// Table is the name of the line's goose version table.
func (l Line) Table() string { return l.Name + "_migrations" }

var lineName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,40}$`)

func (l Line) validate() error {
	if !lineName.MatchString(l.Name) {
		return fmt.Errorf("migration line name %q: want lower-case letters, digits and _", l.Name)
	}
	if l.FS == nil {
		return fmt.Errorf("migration line %s: no files", l.Name)
	}
	return nil
}

// lockID serialises migrators of one database across processes: Apply
// holds it with goose's session locker (a session-level advisory lock)
// while it applies every line.
const lockID = 7_215_402_113

// ErrEdited is returned when a migration file differs from the one applied
// earlier. Applied migrations are history: change the schema with a new
// file instead.
var ErrEdited = errors.New("applied migration was edited")

// ErrBehind is returned by Check when the database lacks migrations the
// binary needs.
var ErrBehind = errors.New("database schema is behind this binary")

// Applied is one migration file applied by Up.
type Applied struct {
	Line     string
	File     string
	Version  int64
	Duration time.Duration
}

func (a Applied) String() string { return a.Line + "/" + a.File }

// Up creates the database named in databaseURL when it does not exist, then
// applies every line in order. It is idempotent and safe to run from
// several processes at once; it returns the files it applied.
func Up(ctx context.Context, databaseURL string, lines ...Line) ([]Applied, error) {
	if err := EnsureDatabase(ctx, databaseURL); err != nil {
		return nil, err
	}
	db, err := openDB(databaseURL)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	return Apply(ctx, db, lines...)
}

// Apply applies every line on db, in order, after checking that no applied
// file was edited.
func Apply(ctx context.Context, db *sql.DB, lines ...Line) (_ []Applied, err error) {
	// One session-level advisory lock (goose's locker) covers every line
	// and the checksum bookkeeping, so concurrent first runs agree.
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	if err := locker.SessionLock(ctx, conn); err != nil {
		return nil, fmt.Errorf("take migration lock: %w", err)
	}
	defer func() {
		if uerr := locker.SessionUnlock(context.WithoutCancel(ctx), conn); uerr != nil && err == nil {
			err = fmt.Errorf("release migration lock: %w", uerr)
		}
	}()
	if err := refuseOldLayout(ctx, db); err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, checksumTable); err != nil {
		return nil, fmt.Errorf("create migration_checksums: %w", err)
	}
	var out []Applied
	for _, l := range lines {
		applied, err := applyLine(ctx, db, l)
		out = append(out, applied...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

func applyLine(ctx context.Context, db *sql.DB, l Line) ([]Applied, error) {
	files, err := lineFiles(l)
	if err != nil {
		return nil, err
	}
	if err := verify(ctx, db, l, files); err != nil {
		return nil, err
	}
	p, err := provider(db, l)
	if err != nil {
		return nil, err
	}
	results, err := p.Up(ctx)
	var out []Applied
	for _, r := range results {
		if r.Error == nil {
			out = append(out, Applied{Line: l.Name, File: path.Base(r.Source.Path), Version: r.Source.Version, Duration: r.Duration})
		}
	}
	if err != nil {
		return out, fmt.Errorf("apply migration line %s: %w", l.Name, err)
	}
	// Record what is applied now, including files applied before checksums
	// were kept (trusted on first sight).
	if err := record(ctx, db, l, files); err != nil {
		return out, err
	}
	return out, nil
}

// FileStatus is one migration file of a line and whether it is applied.
type FileStatus struct {
	File      string
	Version   int64
	Applied   bool
	AppliedAt time.Time
	// Edited is set for an applied file whose content differs from the
	// checksum recorded when it was applied.
	Edited bool
}

// LineStatus is the state of one line in a database.
type LineStatus struct {
	Line  string
	Table string
	Files []FileStatus
	// Unknown lists versions the database has applied that this binary
	// does not embed (a newer binary migrated it).
	Unknown []int64
}

// Status reports every file of every line and whether the database has it.
// It reads the version tables directly: no lock is taken and nothing is
// created, so it is safe against a live database and during a migration.
func Status(ctx context.Context, databaseURL string, lines ...Line) ([]LineStatus, error) {
	db, err := openDB(databaseURL)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	recorded, err := recordedSums(ctx, db)
	if err != nil {
		return nil, err
	}
	var out []LineStatus
	for _, l := range lines {
		files, err := lineFiles(l)
		if err != nil {
			return nil, err
		}
		applied, err := appliedVersions(ctx, db, l)
		if err != nil {
			return nil, err
		}
		ls := LineStatus{Line: l.Name, Table: l.Table()}
		embedded := map[int64]bool{}
		for _, f := range files {
			embedded[f.version] = true
			st := FileStatus{File: f.name, Version: f.version}
			if at, ok := applied[f.version]; ok {
				st.Applied, st.AppliedAt = true, at
				if want, ok := recorded[key{l.Name, f.version}]; ok {
					st.Edited = !bytes.Equal(want, f.sum)
				}
			}
			ls.Files = append(ls.Files, st)
		}
		for v := range applied {
			if !embedded[v] {
				ls.Unknown = append(ls.Unknown, v)
			}
		}
		slices.Sort(ls.Unknown)
		out = append(out, ls)
	}
	return out, nil
}

// Check reports whether the database holds every migration of every line
// that the binary embeds. It wraps ErrBehind, naming the first line that is
// behind and its missing files. Readiness uses it: a service whose tables
// are missing cannot serve, and says so instead of failing each request.
// Like Status it only reads, so it never waits on a running migration.
func Check(ctx context.Context, db *sql.DB, lines ...Line) error {
	for _, l := range lines {
		files, err := lineFiles(l)
		if err != nil {
			return err
		}
		applied, err := appliedVersions(ctx, db, l)
		if err != nil {
			return err
		}
		var missing []string
		for _, f := range files {
			if _, ok := applied[f.version]; !ok {
				missing = append(missing, f.name)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%w: migration line %s lacks %s", ErrBehind, l.Name, strings.Join(missing, ", "))
		}
	}
	return nil
}

// appliedVersions reads a line's goose version table through goose's own
// store, without a provider (which would lock and create the table).
func appliedVersions(ctx context.Context, db *sql.DB, l Line) (map[int64]time.Time, error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	store, err := database.NewStore(database.DialectPostgres, l.Table())
	if err != nil {
		return nil, fmt.Errorf("migration line %s: %w", l.Name, err)
	}
	exists, err := store.(database.StoreExtender).TableExists(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", l.Table(), err)
	}
	out := map[int64]time.Time{}
	if !exists {
		return out, nil
	}
	list, err := store.ListMigrations(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", l.Table(), err)
	}
	for _, m := range list {
		if !m.IsApplied || m.Version == 0 { // 0 is goose's marker row
			continue
		}
		got, err := store.GetMigration(ctx, db, m.Version)
		if err != nil {
			return nil, fmt.Errorf("read %s version %d: %w", l.Table(), m.Version, err)
		}
		out[m.Version] = got.Timestamp
	}
	return out, nil
}

type file struct {
	name    string
	version int64
	sum     []byte
}

// lineFiles lists the line's files in version order with their checksums.
func lineFiles(l Line) ([]file, error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	names, err := fs.Glob(l.FS, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("list migration line %s: %w", l.Name, err)
	}
	var out []file
	for _, name := range names {
		v, err := goose.NumericComponent(name)
		if err != nil {
			return nil, fmt.Errorf("migration %s/%s: %w", l.Name, name, err)
		}
		b, err := fs.ReadFile(l.FS, name)
		if err != nil {
			return nil, fmt.Errorf("read migration %s/%s: %w", l.Name, name, err)
		}
		sum := sha256.Sum256(b)
		out = append(out, file{name: name, version: v, sum: sum[:]})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("migration line %s has no files", l.Name)
	}
	slices.SortFunc(out, func(a, b file) int { return cmp.Compare(a.version, b.version) })
	return out, nil
}

func provider(db *sql.DB, l Line) (*goose.Provider, error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	// No locker here: Apply holds the session lock around all lines.
	p, err := goose.NewProvider(goose.DialectPostgres, db, l.FS,
		goose.WithTableName(l.Table()),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		return nil, fmt.Errorf("migration line %s: %w", l.Name, err)
	}
	return p, nil
}

const checksumTable = `CREATE TABLE IF NOT EXISTS migration_checksums (
	line        text        NOT NULL,
	version     bigint      NOT NULL,
	file        text        NOT NULL,
	sha256      bytea       NOT NULL,
	recorded_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (line, version))`

type key struct {
	line    string
	version int64
}

func recordedSums(ctx context.Context, db *sql.DB) (map[key][]byte, error) {
	out := map[key][]byte{}
	rows, err := db.QueryContext(ctx, "SELECT line, version, sha256 FROM migration_checksums")
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
			return out, nil // nothing applied yet
		}
		return nil, fmt.Errorf("read migration_checksums: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k key
		var sum []byte
		if err := rows.Scan(&k.line, &k.version, &sum); err != nil {
			return nil, fmt.Errorf("read migration_checksums: %w", err)
		}
		out[k] = sum
	}
	return out, rows.Err()
}

// verify refuses to migrate when a file that the database recorded as
// applied has changed since.
func verify(ctx context.Context, db *sql.DB, l Line, files []file) error {
	recorded, err := recordedSums(ctx, db)
	if err != nil {
		return err
	}
	for _, f := range files {
		if want, ok := recorded[key{l.Name, f.version}]; ok && !bytes.Equal(want, f.sum) {
			return fmt.Errorf("%w: %s/%s differs from the file applied to this database; "+
				"restore it and put the change in a new migration", ErrEdited, l.Name, f.name)
		}
	}
	return nil
}

// record stores the checksum of every applied file not recorded yet.
func record(ctx context.Context, db *sql.DB, l Line, files []file) error {
	applied, err := appliedVersions(ctx, db, l)
	if err != nil {
		return err
	}
	for _, f := range files {
		if _, ok := applied[f.version]; !ok {
			continue
		}
		if _, err := db.ExecContext(ctx,
			"INSERT INTO migration_checksums (line, version, file, sha256) VALUES ($1, $2, $3, $4) ON CONFLICT (line, version) DO NOTHING",
			l.Name, f.version, f.name, f.sum); err != nil {
			return fmt.Errorf("record checksum of %s/%s: %w", l.Name, f.name, err)
		}
	}
	return nil
}

// refuseOldLayout stops a database created by the single-table runner this
// package replaced: its schema_migrations table does not say which line a
// file belonged to, and applying the lines on top would fail half way.
func refuseOldLayout(ctx context.Context, db *sql.DB) error {
	var old bool
	if err := db.QueryRowContext(ctx, "SELECT to_regclass('schema_migrations') IS NOT NULL").Scan(&old); err != nil {
		return fmt.Errorf("inspect database: %w", err)
	}
	if old {
		return errors.New("this database was migrated with the earlier single-line layout (table schema_migrations); " +
			"it cannot be converted in place: drop and recreate it (dropdb NAME; the next migrate creates it), or restore a backup taken with this layout")
	}
	return nil
}

func openDB(databaseURL string) (*sql.DB, error) {
	cfg, err := connConfig(databaseURL)
	if err != nil {
		return nil, err
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(4) // the lock's session, goose's, and a spare
	return db, nil
}

// EnsureDatabase creates the database named in databaseURL when it does not
// exist, connecting to the "postgres" maintenance database with the same
// credentials.
func EnsureDatabase(ctx context.Context, databaseURL string) error {
	cfg, err := connConfig(databaseURL)
	if err != nil {
		return err
	}
	name := cfg.Database
	if name == "" || name == "postgres" {
		return nil
	}
	cfg.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to maintenance database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return fmt.Errorf("look up database %q: %w", name, err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	// A concurrent creator won: PostgreSQL reports duplicate_database, or,
	// when both got past the existence check at once, a unique violation
	// on pg_database's name index.
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %q: %w", name, err)
	}
	return nil
}

// connConfig parses a database URL the way the services' pools do, so the
// URL a service runs with also migrates: pgxpool's own settings, such as
// pool_max_conns, are accepted and left out of the single connections
// made here (PostgreSQL would refuse them as unknown parameters).
func connConfig(databaseURL string) (*pgx.ConnConfig, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	return cfg.ConnConfig, nil
}
