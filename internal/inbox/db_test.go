package inbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/outboxref/orders/internal/inbox"
)

// The package's tests need nothing from the service around it: each gets a
// fresh database with the inbox's own migrations, applied with goose the
// way a service applies them. PostgreSQL must be running; when it is not,
// the test fails with a message saying how to point it at a server. It
// never skips.

// envDatabaseURL names the variable holding the test server's maintenance
// database URL.
const envDatabaseURL = "TEST_DATABASE_URL"

// testDB is one test's database.
type testDB struct {
	Pool *pgxpool.Pool
	URL  string
}

// newTestDB creates a database, applies the inbox's migration line and
// drops the database when the test ends.
func newTestDB(t testing.TB) *testDB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	server := os.Getenv(envDatabaseURL)
	if server == "" {
		server = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatalf("PostgreSQL is not reachable at %s: %v\nStart it, or set %s to a server's maintenance database URL.", server, err, envDatabaseURL)
	}
	defer admin.Close(ctx)

	b := make([]byte, 8)
	_, _ = rand.Read(b)
	name := "inbox_test_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, server)
		if err != nil {
			t.Errorf("drop %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})

	cfg := admin.Config().Copy()
	cfg.Database = name
	sqlDB := stdlib.OpenDB(*cfg)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, inbox.Migrations(),
		goose.WithTableName(inbox.MigrationLine+"_migrations"), goose.WithSlog(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatalf("inbox migrations: %v", err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("apply inbox migrations: %v", err)
	}

	url := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)
	if cfg.Password != "" {
		url = fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Password, cfg.Host, cfg.Port, name)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("connect to %s: %v", name, err)
	}
	t.Cleanup(pool.Close)
	return &testDB{Pool: pool, URL: url}
}

// exampleDB is newTestDB for Example functions, which have no *testing.T:
// it panics instead of failing, and returns the cleanup to defer.
func exampleDB() (*pgxpool.Pool, func()) {
	t := &exampleTB{}
	db := newTestDB(t)
	return db.Pool, t.cleanup
}

// exampleTB is the little of testing.TB that newTestDB uses.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (e *exampleTB) Helper()                           {}
func (e *exampleTB) Cleanup(f func())                  { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (e *exampleTB) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (e *exampleTB) cleanup() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}
