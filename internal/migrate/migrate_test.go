package migrate_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/migrate"
	"github.com/outboxref/orders/internal/pgtest"
)

func TestLoad(t *testing.T) {
	t.Parallel()
	ms, err := migrate.Load(schema.Orders, "orders")
	require.NoError(t, err)
	require.NotEmpty(t, ms)
	for i, m := range ms {
		require.Equal(t, i+1, m.Version, "migrations are numbered without gaps")
	}

	_, err = migrate.Load(fstest.MapFS{"m/0001_a.sql": {}, "m/0001_b.sql": {}}, "m")
	require.ErrorContains(t, err, "share version 1")
	_, err = migrate.Load(fstest.MapFS{"m/init.sql": {}}, "m")
	require.ErrorContains(t, err, "must start with a positive number")
}

// TestUpCreatesDatabaseAndIsIdempotent runs Up against a database that does
// not exist yet, several times and concurrently.
func TestUpCreatesDatabaseAndIsIdempotent(t *testing.T) {
	t.Parallel()
	ms, err := migrate.Load(schema.Orders, "orders")
	require.NoError(t, err)
	ctx := context.Background()

	name := fmt.Sprintf("migrate_test_%d", time.Now().UnixNano())
	u, err := url.Parse(pgtest.ServerURL())
	require.NoError(t, err)
	u.Path = "/" + name
	dbURL := u.String()
	admin, err := pgx.Connect(ctx, pgtest.ServerURL())
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") })

	var wg sync.WaitGroup
	applied := make([][]string, 3)
	errs := make([]error, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			applied[i], errs[i] = migrate.Up(ctx, dbURL, ms)
		}()
	}
	wg.Wait()
	total := 0
	for i := range 3 {
		require.NoError(t, errs[i])
		total += len(applied[i])
	}
	require.Equal(t, len(ms), total, "each migration is applied exactly once across concurrent runs")

	again, err := migrate.Up(ctx, dbURL, ms)
	require.NoError(t, err)
	require.Empty(t, again)
}
