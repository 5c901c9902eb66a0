package outbox_test

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

	"github.com/outboxref/orders/internal/outbox"
)

// The package's tests need nothing from the service around it: each gets a
// fresh database with the outbox's own migrations, applied with goose the
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

// newTestDB creates a database, applies the outbox's migration line and
// drops the database when the test ends.
func newTestDB(t testing.TB) *testDB {
	t.Helper()
	db, drop, err := createTestDB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Error(err)
		}
	})
	return db
}

// createTestDB does newTestDB's work for callers without a testing.TB
// (Example functions). drop closes the pool and drops the database.
func createTestDB() (db *testDB, drop func() error, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	server := os.Getenv(envDatabaseURL)
	if server == "" {
		server = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		return nil, nil, fmt.Errorf("PostgreSQL is not reachable at %s: %w\nStart it, or set %s to a server's maintenance database URL", server, err, envDatabaseURL)
	}
	defer admin.Close(ctx)

	b := make([]byte, 8)
	_, _ = rand.Read(b)
	name := "outbox_test_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, nil, fmt.Errorf("create test database: %w", err)
	}
	var pool *pgxpool.Pool
	drop = func() error {
		if pool != nil {
			pool.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, server)
		if err != nil {
			return fmt.Errorf("drop %s: %w", name, err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop %s: %w", name, err)
		}
		return nil
	}
	defer func() {
		if err != nil {
			_ = drop() // the error being returned is the one that matters
		}
	}()

	cfg := admin.Config().Copy()
	cfg.Database = name
	sqlDB := stdlib.OpenDB(*cfg)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, outbox.Migrations(),
		goose.WithTableName(outbox.MigrationLine+"_migrations"), goose.WithSlog(slog.New(slog.DiscardHandler)))
	if err != nil {
		return nil, nil, fmt.Errorf("outbox migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return nil, nil, fmt.Errorf("apply outbox migrations: %w", err)
	}

	url := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)
	if cfg.Password != "" {
		url = fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Password, cfg.Host, cfg.Port, name)
	}
	pool, err = pgxpool.New(ctx, url)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", name, err)
	}
	return &testDB{Pool: pool, URL: url}, drop, nil
}
