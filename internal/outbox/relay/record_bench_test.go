package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxref/orders/internal/outbox/internal/direct"
	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
)

// benchLeased is one claimed row as the drain benchmark writes them, with
// a stored trace context as rows written under a traced request have.
func benchLeased() leased {
	return leased{
		claim: claim{
			EventID:          uuid.New(),
			AggregateType:    "test",
			AggregateID:      "agg-12345",
			AggregateVersion: 2,
			EventType:        "test.strict",
			SchemaVersion:    1,
			CreatedAt:        time.Now(),
			Attempts:         0,
			NextAttemptAt:    time.Now(),
			RelayPartition:   3,
			Epoch:            1,
		},
		payload:     []byte(`{"n": 2}`),
		traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		mode:        direct.ModeOutbox,
	}
}

func benchRelay() *Relay {
	r := &Relay{
		cfg:    Config{Topic: "bench.events", Source: "urn:outboxref:bench", Owner: "bench"},
		tracer: noop.NewTracerProvider().Tracer(scopeName),
	}
	r.produceName, r.produceOpts = produceStart(r.cfg.Topic)
	return r
}

// BenchmarkBuildRecord is the CloudEvents encoding of one row.
func BenchmarkBuildRecord(b *testing.B) {
	r, l := benchRelay(), benchLeased()
	for b.Loop() {
		_ = r.buildRecord(&l, l.traceparent, "")
	}
}

// BenchmarkRecord is what the relay does per row before handing it to the
// producer: the produce span (a no-op tracer here, the default without an
// OpenTelemetry SDK), its trace context, and the record.
func BenchmarkRecord(b *testing.B) {
	r, l := benchRelay(), benchLeased()
	ctx := context.Background()
	for b.Loop() {
		rec, span := r.record(ctx, &l)
		span.End()
		_ = rec
	}
}

// BenchmarkReadBatch is the relay's handling of one read batch of the
// default size before anything is sent: the rows become the batch, each
// with its partition's epoch.
func BenchmarkReadBatch(b *testing.B) {
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	base := time.Now()
	epochs := map[int32]int64{}
	rows := make([]outboxdb.OutboxReadRow, DefaultBatchSize)
	for i := range rows {
		at := base.Add(time.Duration(i) * time.Microsecond)
		rows[i] = outboxdb.OutboxReadRow{
			EventID: uuid.New(), AggregateType: "test", AggregateID: fmt.Sprintf("agg-%d", i),
			AggregateVersion: 1, EventType: "test.strict", SchemaVersion: 1, Payload: []byte(`{"n": 1}`),
			Traceparent: &tp, CreatedAt: at, NextAttemptAt: at, RelayPartition: int32(i % 16),
			PublishMode: string(direct.ModeOutbox),
		}
		epochs[int32(i%16)] = 1
	}
	for b.Loop() {
		_ = readBatch(rows, epochs)
	}
}
