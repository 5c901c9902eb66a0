package drainloop_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/internal/outboxtest"
	"github.com/outboxref/orders/internal/outbox/relay/drainloop"
)

// backlog commits three versions of each of aggregates aggregates, one
// transaction per version round, so that later versions are due after
// earlier ones and a batch holds both first and later versions.
func backlog(t *testing.T, e *outboxtest.Env, aggregates int) int {
	t.Helper()
	for v := int64(1); v <= 3; v++ {
		evs := make([]outbox.Event, aggregates)
		for i := range evs {
			evs[i] = outboxtest.Event(fmt.Sprintf("agg-%d", i), v)
		}
		e.Insert(t, evs...)
		time.Sleep(2 * time.Millisecond)
	}
	return 3 * aggregates
}

// TestDrainToBroker: the loop with a broker delivers every row once, in
// each aggregate's order, and confirms each at the position the broker
// gave its record.
func TestDrainToBroker(t *testing.T) {
	t.Parallel()
	e := outboxtest.Setup(t)
	n := backlog(t, e, 40)
	conn, err := e.DB.Pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()

	got, err := drainloop.DrainToBroker(context.Background(), conn, e.Conn, outboxtest.Topic, "bench", 7)
	require.NoError(t, err)
	assert.Equal(t, n, got)
	assert.Zero(t, e.Count(t, "state <> 'delivered'"))

	rows := e.Rows(t)
	recs := e.ReadAll(t)
	require.Equal(t, n, len(recs), "records on the topic: every event sent once")
	last := map[string]int64{}
	for _, r := range recs {
		assert.Equal(t, last[r.Key]+1, r.Version, "aggregate %s out of order on the topic", r.Key)
		last[r.Key] = r.Version
		row := rows[r.EventID]
		require.NotNil(t, row.Partition, "event %s", r.EventID)
		assert.Equal(t, r.Partition, *row.Partition, "event %s", r.EventID)
		assert.Equal(t, r.Offset, *row.Offset, "event %s", r.EventID)
	}
	assert.Zero(t, e.Count(t, "relay_partition IN (SELECT partition FROM outbox_relay_partition WHERE owner IS NOT NULL)"),
		"partitions given back")
}

// TestDrain: the loop without a broker confirms every row once.
func TestDrain(t *testing.T) {
	t.Parallel()
	e := outboxtest.Setup(t)
	n := backlog(t, e, 40)
	conn, err := e.DB.Pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()

	got, err := drainloop.Drain(context.Background(), conn, 7)
	require.NoError(t, err)
	assert.Equal(t, n, got)
	assert.Zero(t, e.Count(t, "state <> 'delivered'"))
	offsets := map[int64]uuid.UUID{}
	for id, r := range e.Rows(t) {
		require.NotNil(t, r.Offset)
		_, dup := offsets[*r.Offset]
		assert.False(t, dup, "offset %d given twice", *r.Offset)
		offsets[*r.Offset] = id
	}
}
