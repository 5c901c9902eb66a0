package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/pgtest"
)

// The backlog's ids must be what the service writes, UUIDv7 in time
// order: with random ids a drain reads and writes pages all over the
// primary key and the aggregate key, and the recovery scenario measures
// the buffer cache instead of the relay.
func TestFillWritesTimeOrderedUUIDv7(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t, schema.Orders()...)
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	_, err := db.Pool.Exec(ctx, uuid7SQL)
	require.NoError(t, err)
	for lo := int64(0); lo < 3000; lo += 1000 {
		_, err = db.Pool.Exec(ctx, fillSQL, "00ff", lo, base, lo+999)
		require.NoError(t, err)
	}

	type row struct {
		id, order uuid.UUID
		at        time.Time
	}
	var got []row
	rows, err := db.Pool.Query(ctx, `SELECT event_id, aggregate_id::uuid, created_at FROM outbox ORDER BY created_at, aggregate_version`)
	require.NoError(t, err)
	for rows.Next() {
		var r row
		require.NoError(t, rows.Scan(&r.id, &r.order, &r.at))
		got = append(got, r)
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, 6000)

	for i, r := range got {
		for _, u := range []uuid.UUID{r.id, r.order} {
			require.Equal(t, uuid.Version(7), u.Version(), u.String())
			require.Equal(t, uuid.RFC4122, u.Variant(), u.String())
		}
		sec, nsec := r.id.Time().UnixTime()
		require.WithinDuration(t, r.at, time.Unix(sec, nsec), time.Millisecond, "event %s at %s", r.id, r.at)
		// The time and its fraction, the first 8 bytes, never go back.
		// Two events of one instant (an order placed as another is paid)
		// are ordered by their random bits, as the service's would be.
		if i > 0 {
			require.LessOrEqual(t, bytes.Compare(got[i-1].id[:8], r.id[:8]), 0,
				"event ids out of time order at %s: %s after %s", r.at, r.id, got[i-1].id)
		}
	}
}
