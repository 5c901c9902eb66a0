package migrate_test

import (
	"context"
	"database/sql"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/migrate"
	"github.com/outboxref/orders/internal/pgtest"
)

func scratch(t *testing.T) string { return pgtest.Scratch(t, "migrate_test") }

func open(t *testing.T, dbURL string) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { db.Close() })
	return db
}

// TestUpCreatesDatabaseAndIsIdempotent runs Up against a database that does
// not exist yet, several times and concurrently: every file of every line is
// applied exactly once.
func TestUpCreatesDatabaseAndIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := scratch(t)
	lines := schema.Orders()

	var wg sync.WaitGroup
	applied := make([][]migrate.Applied, 3)
	errs := make([]error, 3)
	for i := range 3 {
		wg.Go(func() { applied[i], errs[i] = migrate.Up(ctx, dbURL, lines...) })
	}
	wg.Wait()
	seen := map[string]int{}
	for i := range 3 {
		require.NoError(t, errs[i])
		for _, a := range applied[i] {
			seen[a.String()]++
		}
	}
	want := map[string]int{}
	for _, l := range lines {
		files, err := fs.Glob(l.FS, "*.sql")
		require.NoError(t, err)
		for _, f := range files {
			want[l.Name+"/"+f] = 1
		}
	}
	require.Contains(t, want, "outbox/00001_outbox.sql")
	require.Equal(t, want, seen, "each file is applied exactly once across concurrent runs")

	again, err := migrate.Up(ctx, dbURL, lines...)
	require.NoError(t, err)
	require.Empty(t, again)
	require.NoError(t, migrate.Check(ctx, open(t, dbURL), lines...))
}

// TestLinesAreIndependent: two lines both numbered from 1 are tracked in
// their own tables, and a new file in one line leaves the other alone.
func TestLinesAreIndependent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := scratch(t)
	lib := fstest.MapFS{"00001_lib.sql": {Data: []byte("-- +goose Up\nCREATE TABLE lib_items (id int PRIMARY KEY);\n")}}
	svc := fstest.MapFS{"00001_svc.sql": {Data: []byte("-- +goose Up\nCREATE TABLE svc_items (id int PRIMARY KEY);\n")}}
	lines := []migrate.Line{{Name: "lib", FS: lib}, {Name: "svc", FS: svc}}
	_, err := migrate.Up(ctx, dbURL, lines...)
	require.NoError(t, err)

	lib["00002_lib_more.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nALTER TABLE lib_items ADD COLUMN name text;\n")}
	db := open(t, dbURL)
	err = migrate.Check(ctx, db, lines...)
	require.ErrorIs(t, err, migrate.ErrBehind)
	require.ErrorContains(t, err, "migration line lib lacks 00002_lib_more.sql")

	applied, err := migrate.Up(ctx, dbURL, lines...)
	require.NoError(t, err)
	require.Len(t, applied, 1)
	require.Equal(t, "lib/00002_lib_more.sql", applied[0].String())
	require.NoError(t, migrate.Check(ctx, db, lines...))

	st, err := migrate.Status(ctx, dbURL, lines...)
	require.NoError(t, err)
	require.Len(t, st, 2)
	require.Equal(t, "lib_migrations", st[0].Table)
	require.Len(t, st[0].Files, 2)
	require.Len(t, st[1].Files, 1)
	for _, l := range st {
		for _, f := range l.Files {
			require.True(t, f.Applied, "%s/%s", l.Line, f.File)
			require.False(t, f.Edited)
		}
	}
}

// TestEditedMigrationRefused: changing a file after it was applied stops
// the next run before it touches anything, and status shows which file.
func TestEditedMigrationRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := scratch(t)
	files := fstest.MapFS{"00001_a.sql": {Data: []byte("-- +goose Up\nCREATE TABLE a (id int);\n")}}
	line := migrate.Line{Name: "edit", FS: files}
	_, err := migrate.Up(ctx, dbURL, line)
	require.NoError(t, err)

	files["00001_a.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nCREATE TABLE a (id bigint);\n")}
	files["00002_b.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nCREATE TABLE b (id int);\n")}
	_, err = migrate.Up(ctx, dbURL, line)
	require.ErrorIs(t, err, migrate.ErrEdited)
	require.ErrorContains(t, err, "edit/00001_a.sql differs from the file applied to this database")

	st, err := migrate.Status(ctx, dbURL, line)
	require.NoError(t, err)
	require.True(t, st[0].Files[0].Edited)
	require.False(t, st[0].Files[1].Applied, "nothing after the edited file was applied")
}

// TestNoTransactionMigration: a file marked NO TRANSACTION runs outside a
// transaction, which CREATE INDEX CONCURRENTLY requires.
func TestNoTransactionMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := scratch(t)
	line := migrate.Line{Name: "conc", FS: fstest.MapFS{
		"00001_t.sql":   {Data: []byte("-- +goose Up\nCREATE TABLE t (id int, n int);\n")},
		"00002_idx.sql": {Data: []byte("-- +goose NO TRANSACTION\n-- +goose Up\nCREATE INDEX CONCURRENTLY t_n_idx ON t (n);\n")},
	}}
	_, err := migrate.Up(ctx, dbURL, line)
	require.NoError(t, err)
	var n int
	require.NoError(t, open(t, dbURL).QueryRowContext(ctx, "SELECT count(*) FROM pg_indexes WHERE indexname = 't_n_idx'").Scan(&n))
	require.Equal(t, 1, n)
}

// TestFailedMigrationRollsBack: a file that fails leaves nothing of itself
// behind and is not recorded, so fixing it and running again works.
func TestFailedMigrationRollsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := scratch(t)
	files := fstest.MapFS{"00001_bad.sql": {Data: []byte("-- +goose Up\nCREATE TABLE half (id int);\nSELECT no_such_function();\n")}}
	line := migrate.Line{Name: "bad", FS: files}
	_, err := migrate.Up(ctx, dbURL, line)
	require.ErrorContains(t, err, "no_such_function")
	db := open(t, dbURL)
	var exists bool
	require.NoError(t, db.QueryRowContext(ctx, "SELECT to_regclass('half') IS NOT NULL").Scan(&exists))
	require.False(t, exists, "the failed file's first statement was rolled back")
	require.ErrorIs(t, migrate.Check(ctx, db, line), migrate.ErrBehind)

	files["00001_bad.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nCREATE TABLE half (id int);\n")}
	_, err = migrate.Up(ctx, dbURL, line)
	require.NoError(t, err)
}

// TestOldLayoutRefused: a database migrated by the earlier single-table
// runner is refused with an explanation instead of half-applied.
func TestOldLayoutRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := scratch(t)
	require.NoError(t, migrate.EnsureDatabase(ctx, dbURL))
	_, err := open(t, dbURL).ExecContext(ctx, "CREATE TABLE schema_migrations (version integer PRIMARY KEY)")
	require.NoError(t, err)
	_, err = migrate.Up(ctx, dbURL, schema.Orders()...)
	require.ErrorContains(t, err, "earlier single-line layout")
}

func TestLineNameValidated(t *testing.T) {
	t.Parallel()
	_, err := migrate.Status(context.Background(), pgtest.ServerURL(), migrate.Line{Name: "Bad-Name", FS: fstest.MapFS{}})
	require.ErrorContains(t, err, `migration line name "Bad-Name"`)
}

// TestPoolSettingsInURL: the URL a service's pool runs with, including
// pgxpool's own settings, also migrates and reports status.
func TestPoolSettingsInURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := scratch(t)
	if strings.Contains(dbURL, "?") {
		dbURL += "&pool_max_conns=7"
	} else {
		dbURL += "?pool_max_conns=7"
	}
	_, err := migrate.Up(ctx, dbURL, schema.Orders()...)
	require.NoError(t, err)
	st, err := migrate.Status(ctx, dbURL, schema.Orders()...)
	require.NoError(t, err)
	require.NotEmpty(t, st)
}
