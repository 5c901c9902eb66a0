package notify

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/db/migrations"
	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/pgtest"
)

// BenchmarkConsume measures records per second through the consumer, from
// Run to the last record's local commit, against real PostgreSQL and a
// kfake broker over TCP. Each iteration drains a fresh backlog on a fresh
// topic with a fresh group: orders x events per order, every order starting
// with order.placed, so each record is applied (projection, ledger row,
// processed_event) rather than absorbed. The group join is inside the
// timing; it is small next to the work. The small case keeps
// `-benchtime=1x` quick enough for CI:
//
//	go test -run '^$' -bench 'BenchmarkConsume/records=100$' -benchtime=1x ./internal/notify/
func BenchmarkConsume(b *testing.B) {
	for _, size := range []struct{ orders, perOrder int }{{20, 5}, {200, 10}} {
		b.Run(fmt.Sprintf("records=%d", size.orders*size.perOrder), func(b *testing.B) {
			benchmarkConsume(b, size.orders, size.perOrder, 0)
		})
	}
}

// BenchmarkConsumeOneRecordPerTx is BenchmarkConsume with one local
// transaction per record (NOTIFIER_BATCH_MAX=1), the path a failed batch
// falls back to.
func BenchmarkConsumeOneRecordPerTx(b *testing.B) {
	for _, size := range []struct{ orders, perOrder int }{{20, 5}, {200, 10}} {
		b.Run(fmt.Sprintf("records=%d", size.orders*size.perOrder), func(b *testing.B) {
			benchmarkConsume(b, size.orders, size.perOrder, 1)
		})
	}
}

func benchmarkConsume(b *testing.B, orders, perOrder, batchMax int) {
	db := pgtest.New(b, migrations.Notifier()...)
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(b, err)
	b.Cleanup(c.Close)
	broker := c.ListenAddrs()[0]
	prod, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(5*time.Millisecond))
	require.NoError(b, err)
	b.Cleanup(prod.Close)
	adm := kadm.NewClient(prod)
	quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))

	// After the placed event, cycle through types that each touch the
	// projection; most of them also write a send-ledger row.
	cycle := []string{TypePaid, TypeShipped, TypeCancelled, TypeRefundRequested}
	n := orders * perOrder
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		topic := fmt.Sprintf("bench-%d-%s", i, uuid.NewString()[:8])
		_, err := adm.CreateTopic(ctx, 6, 1, nil, topic)
		require.NoError(b, err)
		recs := make([]*kgo.Record, 0, n)
		for range orders {
			o := newOrder()
			recs = append(recs, o.record(b, o.next(TypePlaced, nil)))
			for j := 1; j < perOrder; j++ {
				recs = append(recs, o.record(b, o.next(cycle[(j-1)%len(cycle)], nil)))
			}
		}
		for _, r := range recs {
			r.Topic = topic
		}
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		require.NoError(b, prod.ProduceSync(pctx, recs...).FirstErr())
		cancel()

		proj := NewProjector(quiet)
		ib, err := inbox.New(inbox.Config{Pool: db.Pool, Apply: proj.Apply, Covered: proj.Covered, Rejected: proj.Rejected,
			GapWindow: time.Minute, Registerer: prometheus.NewRegistry(), Logger: quiet})
		require.NoError(b, err)
		m, err := NewMetrics(prometheus.NewRegistry())
		require.NoError(b, err)
		var applied atomic.Int64
		all := make(chan struct{})
		cons := NewConsumer(ConsumerConfig{
			Brokers: []string{broker}, Topic: topic, Group: topic, MaxBatchRecords: batchMax,
			ExtraOpts: []kgo.Opt{kgo.FetchMaxWait(100 * time.Millisecond)},
		}, db.Pool, ib, m, quiet, func() {
			if applied.Add(1) == int64(n) {
				close(all)
			}
		})
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)

		b.StartTimer()
		go func() { done <- cons.Run(runCtx) }()
		select {
		case <-all:
		case err := <-done:
			b.Fatalf("consumer stopped early: %v", err)
		case <-time.After(5 * time.Minute):
			b.Fatalf("only %d of %d records applied", applied.Load(), n)
		}
		b.StopTimer()
		stop()
		require.NoError(b, <-done)
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "records/s")
}
