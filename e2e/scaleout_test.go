package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// TestScaleOut (V3) runs three `orders serve` processes, each with the API
// and a relay, against one orders database. Clients spread a load of mixed
// commands over the three while one of them is killed with SIGKILL and
// restarted twice. An event no relay can send (its type is unknown to
// every relay) is written straight into the outbox under an aggregate of
// its own before the load starts.
//
// At the end every other committed event is on the topic, the first copies
// of each order's versions appear in version order in one partition (a
// strict type is never overtaken, even by another relay), and the invalid
// event is parked with its reason while everything around it was
// delivered.
func TestScaleOut(t *testing.T) {
	t.Parallel()
	began := time.Now()
	const (
		nOrders = 800
		workers = 8
		victim  = 2 // the instance that is killed
	)
	seed := seedFrom(t, "SCALEOUT_SEED")
	runID := "s" + strconv.FormatUint(seed%1_000_000, 36)
	broker := newBroker(t)
	db := ordersDB(t)

	var (
		instances []*service
		bases     []string
	)
	for i := range 3 {
		addr := freeAddr(t)
		env := ordersEnv(db, addr, broker)
		env["RELAY_BACKOFF_CAP"] = "2s"
		s := newService(t, fmt.Sprintf("orders-%d", i+1), "orders", env, "http://"+addr+"/readyz", "serve")
		instances, bases = append(instances, s), append(bases, "http://"+addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, s := range instances {
		require.NoError(t, s.start(ctx))
	}

	// The invalid event: an event type that no relay knows is parked as
	// unknown_event_type whatever else the relay checks, so this holds
	// whether schemas are validated by the relay or already by the writer
	// (which this raw INSERT bypasses). Its aggregate is used by no other
	// event, because a parked strict event holds back its own aggregate by
	// design (R6).
	invalidID, invalidAggregate := uuid.New(), uuid.New()
	payload, err := json.Marshal(map[string]any{"order_id": invalidAggregate, "reason": "no relay knows this type"})
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
		VALUES ($1, 'order', $2, 1, 'order.voided', 1, $3)`, invalidID, invalidAggregate.String(), payload)
	require.NoError(t, err)

	drv := newDriver(newOrdersClient(bases...), runID)
	var chaosErrs errorList
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		for _, at := range []int{nOrders * 30 / 100, nOrders * 65 / 100} {
			if err := drv.waitCompleted(ctx, at); err != nil {
				return // the load failed or ran out of time; it reports why
			}
			if err := instances[victim].kill(); err != nil {
				chaosErrs.add(err)
				return
			}
			if err := instances[victim].start(ctx); err != nil {
				chaosErrs.add(err)
				cancel()
				return
			}
		}
	}()
	loadErr := drv.run(ctx, nOrders, workers, seed)
	if loadErr != nil {
		cancel()
	}
	<-chaosDone
	require.NoError(t, chaosErrs.err())
	require.NoError(t, loadErr)
	loadTime := time.Since(began)
	_, kills := instances[victim].counts()
	require.Equal(t, 2, kills)

	settle := time.Now()
	waitNoPending(t, db.Pool, 2*time.Minute)
	settleTime := time.Since(settle)
	events := outboxEvents(t, db.Pool)
	want := map[uuid.UUID]bool{}
	for _, e := range events {
		if e.eventID == invalidID {
			require.Equal(t, "parked", e.state, "the invalid event is parked")
			require.NotNil(t, e.errorClass)
			require.Equal(t, "unknown_event_type", *e.errorClass)
			continue
		}
		require.Equal(t, "delivered", e.state, "event %s (%s v%d of %s)", e.eventID, e.eventType, e.version, e.aggregateID)
		want[e.eventID] = true
	}
	require.Len(t, want, len(events)-1)

	records := readTopicToEnd(t, broker)
	copies := checkTopicAgainstOutbox(t, records, events, want)
	require.Zero(t, copies[invalidID], "the parked event was never sent")
	lateCopies := checkAggregateOrder(t, records)
	partitionOf := map[string]int32{}
	for _, rec := range records {
		partitionOf[rec.key] = rec.raw.Partition
	}
	for _, e := range events {
		if e.eventID != invalidID {
			// The confirm recorded the partition the broker acknowledged,
			// whichever relay's copy that was: the aggregate's partition.
			require.NotNil(t, e.partition, "event %s has no broker partition", e.eventID)
			require.Equal(t, partitionOf[e.aggregateID], *e.partition, "partition of %s", e.eventID)
		}
	}

	// Every relay took part, and each reads the parked event from the
	// shared table.
	published := make([]float64, len(instances))
	for i, base := range bases {
		published[i], err = scrapeMetric(base+"/metrics", "outbox_published_total")
		require.NoError(t, err)
		parked, err := scrapeMetric(base+"/metrics", "outbox_parked_events")
		require.NoError(t, err)
		require.Equal(t, 1.0, parked, "orders-%d reports the parked event", i+1)
	}
	for i := range instances {
		if i != victim { // the victim's counter restarted with its last incarnation
			require.Positive(t, published[i], "orders-%d published events: the backlog was shared", i+1)
		}
	}
	t.Logf("scale-out: %d orders, %d events delivered, 1 parked (unknown_event_type); %d records on the topic: %d re-sends, %d later copies of an older version",
		nOrders, len(want), len(records), len(records)-len(copies), lateCopies)
	t.Logf("orders-%d killed and restarted %d times; published by the relays' current incarnations: %v; clients: %s",
		victim+1, kills, published, &drv.stats)
	t.Logf("time: load %s, convergence %s, total %s",
		loadTime.Round(time.Millisecond), settleTime.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}
