package migrate

import (
	"context"
	"database/sql"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// SchemaCheck tells a running service whether its database holds every
// migration the binary embeds. Once it has seen the schema complete it
// answers from memory: migrations only move forward, and readiness probes
// should not query the version tables every few seconds for ever.
type SchemaCheck struct {
	db    *sql.DB
	lines []Line
	ok    atomic.Bool
}

// NewSchemaCheck returns a check over pool's database. It borrows the
// pool's connections and holds none of its own.
func NewSchemaCheck(pool *pgxpool.Pool, lines []Line) *SchemaCheck {
	return &SchemaCheck{db: stdlib.OpenDBFromPool(pool), lines: lines}
}

// Check returns nil when the schema is complete, an error wrapping
// ErrBehind naming what is missing, or the database's error.
func (c *SchemaCheck) Check(ctx context.Context) error {
	if c.ok.Load() {
		return nil
	}
	if err := Check(ctx, c.db, c.lines...); err != nil {
		return err
	}
	c.ok.Store(true)
	return nil
}

// Wait blocks until the schema is complete or ctx ends, checking every
// interval and calling waiting (if not nil) with the reason each time it is
// not. Services call it before starting workers that would otherwise fail,
// or worse park good work, on missing tables.
func (c *SchemaCheck) Wait(ctx context.Context, interval time.Duration, waiting func(error)) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, interval)
		err := c.Check(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if waiting != nil {
			waiting(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}
