package outboxdb_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxref/orders/internal/outbox/internal/outboxtest"
)

// TestPrefixed: the setting holds for the statement and ends with its
// batch, and a commit that fails after the statement returned its rows
// (here a deferred constraint, checked at the batch's end) is reported by
// Query's rows, Exec and QueryRow, as the generated code reads them: the
// caller must never take rows for done that were rolled back.
func TestPrefixed(t *testing.T) {
	t.Parallel()
	db := outboxtest.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		CREATE TABLE prefixed_parent (id int PRIMARY KEY);
		CREATE TABLE prefixed_child (id int PRIMARY KEY,
			parent int REFERENCES prefixed_parent DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	p := outboxdb.Prefixed{DB: conn, Setting: "SELECT set_config('enable_sort', 'off', true)"}

	var inside string
	require.NoError(t, p.QueryRow(ctx, "SELECT current_setting('enable_sort')").Scan(&inside))
	require.Equal(t, "off", inside, "the setting holds for the statement")
	var after string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('enable_sort')").Scan(&after))
	require.Equal(t, "on", after, "the setting ends with the batch")

	// rows reads a statement the way the generated :many methods do.
	rows := func(sql string) (int, error) {
		rs, err := p.Query(ctx, sql)
		if err != nil {
			return 0, err
		}
		defer rs.Close()
		n := 0
		for rs.Next() {
			n++
		}
		return n, rs.Err()
	}
	n, err := rows("INSERT INTO prefixed_child VALUES (1, 7), (2, 7) RETURNING id")
	require.Equal(t, 2, n, "the statement returned its rows before the commit")
	require.ErrorContains(t, err, "prefixed_child_parent_fkey", "Query's rows report the failed commit")
	_, err = p.Exec(ctx, "INSERT INTO prefixed_child VALUES (3, 7)")
	require.ErrorContains(t, err, "prefixed_child_parent_fkey", "Exec reports the failed commit")
	var id int
	err = p.QueryRow(ctx, "INSERT INTO prefixed_child VALUES (4, 7) RETURNING id").Scan(&id)
	require.ErrorContains(t, err, "prefixed_child_parent_fkey", "QueryRow reports the failed commit")
	var left int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM prefixed_child").Scan(&left))
	require.Zero(t, left, "nothing was committed")

	n, err = rows("INSERT INTO prefixed_parent VALUES (7) RETURNING id")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.ErrorIs(t, p.QueryRow(ctx, "SELECT id FROM prefixed_parent WHERE id = 8").Scan(&id), pgx.ErrNoRows)
	require.NoError(t, p.QueryRow(ctx, "SELECT id FROM prefixed_parent WHERE id = 7").Scan(&id))
	require.Equal(t, 7, id)
}

// TestPrefixedAhead: statements queued ahead run first in the same
// transaction, so the statement sees what they wrote, their rows reach
// their reader, and a failure of the statement undoes them.
func TestPrefixedAhead(t *testing.T) {
	t.Parallel()
	db := outboxtest.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, "CREATE TABLE ahead (id int PRIMARY KEY)")
	require.NoError(t, err)
	var wrote []int
	p := func(ids ...int) outboxdb.Prefixed {
		return outboxdb.Prefixed{DB: db.Pool, Setting: "SELECT set_config('enable_sort', 'off', true)", Ahead: []outboxdb.Statement{{
			SQL: "INSERT INTO ahead SELECT unnest($1::int[]) RETURNING id", Args: []any{ids},
			Rows: func(rows pgx.Rows) (err error) {
				wrote, err = pgx.CollectRows(rows, pgx.RowTo[int])
				return err
			},
		}}}
	}

	var seen int
	require.NoError(t, p(1, 2).QueryRow(ctx, "SELECT count(*) FROM ahead").Scan(&seen))
	require.Equal(t, 2, seen, "the statement sees what the statement ahead of it wrote")
	require.ElementsMatch(t, []int{1, 2}, wrote, "the rows of the statement ahead reach its reader")

	err = p(3).QueryRow(ctx, "SELECT 1 / 0").Scan(&seen)
	require.ErrorContains(t, err, "division by zero")
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM ahead").Scan(&seen))
	require.Equal(t, 2, seen, "a failed statement undoes the ones ahead of it")

	err = p(1).QueryRow(ctx, "SELECT 1").Scan(&seen)
	require.ErrorContains(t, err, "ahead_pkey", "an error of a statement ahead is reported")
}
