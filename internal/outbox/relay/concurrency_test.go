package relay_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestConcurrentRelaysKeepOrder (V3): four relays drain a backlog of 20,000
// events over 500 aggregates while the broker fails one produce request in
// 25. Every event reaches the broker, and for strict types the first copy
// of each version appears in its aggregate's partition only after the first
// copies of all earlier versions. A failed version is retried after its
// backoff; without the strict guard a later version overtakes it. The
// relays share the partitions of the aggregates, one owner each: no relay
// confirms in vain a row another relay owned, which a read that ignored
// the partitions would do (R1).
func TestConcurrentRelaysKeepOrder(t *testing.T) {
	t.Parallel()
	const (
		aggregates = 500
		versions   = 40
		total      = aggregates * versions
	)
	e := setup(t)

	// One statement inserts the whole backlog, version-major so that each
	// claim sees many aggregates. Every tenth version is independent.
	_, err := e.DB.Pool.Exec(context.Background(), `
		INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
		SELECT gen_random_uuid(), 'test', 'agg-' || a, v,
		       CASE WHEN v % 10 = 0 THEN $1 ELSE $2 END, 1, jsonb_build_object('n', v)
		FROM generate_series(1, $3::int) v, generate_series(1, $4::int) a
		ORDER BY v, a`, looseType, strictType, versions, aggregates)
	require.NoError(t, err)

	// Unknown-outcome failures make relays retry some versions later than
	// their successors would otherwise be sent.
	var produces atomic.Int64
	e.Kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: -1, When: func(kmsg.Request) bool {
		return produces.Add(1)%25 == 0
	}})

	regs := make([]*prometheus.Registry, 4)
	for i := range regs {
		regs[i] = prometheus.NewRegistry()
		start(t, e.relay(t, func(c *relayConfig) {
			c.Owner = fmt.Sprintf("relay-%d", i)
			c.Registerer = regs[i]
			c.BatchSize = 250
			c.PollInterval = 20 * time.Millisecond
			c.BackoffBase = 20 * time.Millisecond
			c.BackoffCap = 200 * time.Millisecond
		}))
	}
	e.WaitDelivered(t, 150*time.Second)
	require.Zero(t, e.Count(t, "state = 'parked'"))
	require.Positive(t, e.Count(t, "attempts >= 1"), "the faults made some events retry")

	recs := e.ReadAll(t)
	type version struct {
		agg string
		v   int64
	}
	strict := map[version]bool{}
	rows := e.Rows(t)
	for _, r := range rows {
		strict[version{r.AggregateID, r.Version}] = r.Version%10 != 0
	}
	seen := map[uuid.UUID]bool{}
	partitionOf := map[string]int32{}
	firstSeen := map[string]map[int64]bool{} // aggregate -> versions seen
	for _, rec := range recs {
		_, ok := rows[rec.EventID]
		require.True(t, ok, "record %s has no outbox row", rec.EventID)
		if p, ok := partitionOf[rec.Key]; ok {
			require.Equal(t, p, rec.Partition, "aggregate %s in one partition", rec.Key)
		}
		partitionOf[rec.Key] = rec.Partition
		if seen[rec.EventID] {
			continue // a duplicate after an unknown outcome, not a violation
		}
		seen[rec.EventID] = true
		if firstSeen[rec.Key] == nil {
			firstSeen[rec.Key] = map[int64]bool{}
		}
		if strict[version{rec.Key, rec.Version}] {
			for v := int64(1); v < rec.Version; v++ {
				require.True(t, firstSeen[rec.Key][v],
					"%s v%d (strict) reached the broker before v%d", rec.Key, rec.Version, v)
			}
		}
		firstSeen[rec.Key][rec.Version] = true
	}
	require.Len(t, seen, total, "every event reached the broker")
	for i, reg := range regs {
		for _, typ := range []string{strictType, looseType} {
			require.Zero(t, metricValue(t, reg, "outbox_lost_confirms_total", map[string]string{"event_type": typ}),
				"relay-%d confirmed rows of a partition it did not own", i)
		}
	}
}
