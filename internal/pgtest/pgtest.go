// Package pgtest gives each test its own PostgreSQL database, cloned from a
// template that was migrated once per schema version.
//
// Cloning a template takes a fraction of a second, so tests get full
// isolation (they may run in parallel and commit freely) without replaying
// the migrations each time. PostgreSQL must be running: when it is not, the
// test fails with a message saying how to start it. It never skips.
package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxref/orders/internal/migrate"
)

// EnvURL names the variable holding the server's maintenance URL.
const EnvURL = "TEST_DATABASE_URL"

const defaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// DB is one test's database.
type DB struct {
	// Pool is connected to the database and closed in t.Cleanup.
	Pool *pgxpool.Pool
	// URL connects to the database, for processes started by the test.
	URL string
}

// New creates a fresh database with the given migration lines applied and
// drops it when the test ends.
func New(t testing.TB, lines ...migrate.Line) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	admin := connectAdmin(ctx, t)
	defer admin.Close(context.Background())

	tpl, err := ensureTemplate(ctx, admin, lines)
	if err != nil {
		t.Fatalf("pgtest: prepare template database: %v", err)
	}
	name := "test_" + randomHex(8)
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s",
		pgx.Identifier{name}.Sanitize(), pgx.Identifier{tpl}.Sanitize())); err != nil {
		t.Fatalf("pgtest: clone template %s: %v", tpl, err)
	}

	url := withDatabase(t, name)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", name, err)
	}
	t.Cleanup(func() {
		pool.Close()
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		c := connectAdmin(dctx, t)
		defer c.Close(dctx)
		if _, err := c.Exec(dctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize())); err != nil {
			t.Errorf("pgtest: drop %s: %v", name, err)
		}
	})
	return &DB{Pool: pool, URL: url}
}

// ServerURL returns the maintenance URL of the test server.
func ServerURL() string {
	if u := os.Getenv(EnvURL); u != "" {
		return u
	}
	return defaultURL
}

func connectAdmin(ctx context.Context, t testing.TB) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, ServerURL())
	if err != nil {
		t.Fatalf("pgtest: PostgreSQL is not reachable at %s: %v\n"+
			"Start it (pg_ctlcluster --skip-systemctl-redirect 15 main start) or point %s at a server.",
			ServerURL(), err, EnvURL)
	}
	return conn
}

func withDatabase(t testing.TB, name string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(ServerURL())
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", EnvURL, err)
	}
	host := cfg.Host
	if cfg.Port != 0 {
		host = fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
	}
	user := cfg.User
	if cfg.Password != "" {
		user += ":" + cfg.Password
	}
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", user, host, name)
}

// ensureTemplate builds the template for this exact set of migration files
// once per server. A cluster-wide advisory lock serialises test binaries that
// run in parallel; the template is built under a temporary name and renamed
// when complete, so a crash never leaves a half-migrated template behind.
func ensureTemplate(ctx context.Context, admin *pgx.Conn, lines []migrate.Line) (string, error) {
	h := sha256.New()
	for _, l := range lines {
		names, err := fs.Glob(l.FS, "*.sql")
		if err != nil {
			return "", err
		}
		for _, name := range names {
			b, err := fs.ReadFile(l.FS, name)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(h, "%s\x00%s\x00%s\x00", l.Name, name, b)
		}
	}
	tpl := "tpl_" + hex.EncodeToString(h.Sum(nil))[:16]

	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(4242001)"); err != nil {
		return "", err
	}
	defer admin.Exec(context.Background(), "SELECT pg_advisory_unlock(4242001)") //nolint:errcheck // released with the session anyway

	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", tpl).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return tpl, nil
	}
	building := tpl + "_building"
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{building}.Sanitize()+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{building}.Sanitize()); err != nil {
		return "", err
	}
	cfg := admin.Config().Copy()
	cfg.Database = building
	db := stdlib.OpenDB(*cfg)
	// Up's database creation step is a no-op here; apply directly.
	_, err := migrate.Apply(ctx, db, lines...)
	db.Close()
	if err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s",
		pgx.Identifier{building}.Sanitize(), pgx.Identifier{tpl}.Sanitize())); err != nil {
		return "", err
	}
	return tpl, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Scratch returns the URL of a database that does not exist yet, for tests
// of code that creates it (migrate), and drops it when the test ends.
func Scratch(t testing.TB, prefix string) string {
	t.Helper()
	name := prefix + "_" + randomHex(6)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c := connectAdmin(ctx, t)
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize())); err != nil {
			t.Errorf("pgtest: drop %s: %v", name, err)
		}
	})
	return withDatabase(t, name)
}
