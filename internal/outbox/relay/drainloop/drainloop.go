// Package drainloop drains the outbox with the relay's own read and
// confirm statements and nothing else around them: take every partition,
// read a batch, confirm it under the partitions' epochs, repeat. Its two
// loops are the references a relay's throughput is measured against
// (cmd/bench):
//
//   - Drain sends nothing and confirms at made-up broker positions: what a
//     relay could reach if sending cost nothing.
//   - DrainToBroker also sends each batch to a broker, as the relay's
//     records (cloudevents.Record) with the broker's real positions, one
//     batch with the broker while the next is read: what any relay must
//     spend on this host, and so the least a relay can cost.
//
// It is for benchmarks only: Drain marks rows delivered that were never
// sent, neither retries nor releases anything, and neither must run beside
// a relay on the same database.
//
// It lives in the outbox's directory because the statements it runs are
// the outbox's generated code, which is private to the unit.
package drainloop

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox/cloudevents"
	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
)

const owner = "bench-sql-loop"

// DB is what Drain runs on: a connection of the outbox's database (a
// *pgxpool.Conn, a *pgx.Conn) or a transaction in it.
type DB interface {
	outboxdb.DBTX
	outboxdb.Batcher
}

// Drain takes every free partition, reads and confirms batches of at most
// batch rows on db until a read comes back empty, treating every event
// type as strictly ordered, gives the partitions back and returns how many
// rows it confirmed. Like the relay under a backlog, it confirms each
// batch in the round trip that reads the next one
// (outboxdb.OutboxConfirmThenRead).
func Drain(ctx context.Context, db DB, batch int) (int, error) {
	var offset int64
	return drain(ctx, db, batch, false, func(_ context.Context, rows []outboxdb.OutboxReadRow) ([]int32, []int64, error) {
		parts, offsets := make([]int32, len(rows)), make([]int64, len(rows))
		for i := range rows {
			parts[i], offsets[i] = int32(offset%6), offset
			offset++
		}
		return parts, offsets, nil
	})
}

// DrainToBroker drains like Drain, but sends each batch to topic on the
// cluster conn reaches (kgo.SeedBrokers and any credentials), with a
// client set up as the relay's is (acks from every in-sync replica, no
// linger, the key's murmur2 partitioner), and confirms it at the positions
// the broker acknowledged. As in the relay, one batch is with the broker
// while the batch before it is confirmed and the batch after it read, in
// one round trip; every upkeep's floor (about once a second) waits for the
// batch with the broker first. Records are built as the relay builds them,
// with source as their CloudEvents source and no trace context. A record
// the broker refuses ends the drain with an error.
func DrainToBroker(ctx context.Context, db DB, conn []kgo.Opt, topic, source string, batch int) (int, error) {
	cl, err := kgo.NewClient(append(slices.Clone(conn),
		kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
	)...)
	if err != nil {
		return 0, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	return drain(ctx, db, batch, true, func(ctx context.Context, rows []outboxdb.OutboxReadRow) ([]int32, []int64, error) {
		recs := make([]*kgo.Record, len(rows))
		for i, r := range rows {
			recs[i] = cloudevents.Record(topic, cloudevents.Event{
				ID: r.EventID, Type: r.EventType, Source: source, Time: r.CreatedAt,
				AggregateType: r.AggregateType, AggregateID: r.AggregateID, AggregateVersion: r.AggregateVersion,
				SchemaVersion: int(r.SchemaVersion), Data: r.Payload,
			})
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return nil, nil, fmt.Errorf("send: %w", err)
		}
		parts, offsets := make([]int32, len(recs)), make([]int64, len(recs))
		for i, rec := range recs {
			parts[i], offsets[i] = rec.Partition, rec.Offset
		}
		return parts, offsets, nil
	})
}

// send hands a batch to the broker and returns where each row was stored.
type send func(ctx context.Context, rows []outboxdb.OutboxReadRow) (partitions []int32, offsets []int64, err error)

// sent is a batch the broker answered.
type sent struct {
	rows       []outboxdb.OutboxReadRow
	partitions []int32
	offsets    []int64
	err        error
}

// drain is both loops. With overlap, while one batch is with the broker
// (send, in a goroutine), the batch before it is confirmed and the one
// after it read. Without, each batch is sent as soon as it is read, and
// every read starts from the floor.
func drain(ctx context.Context, db DB, batch int, overlap bool, send send) (n int, err error) {
	q := outboxdb.New(db)
	owned, err := q.RelayPartitionsAcquire(ctx, outboxdb.RelayPartitionsAcquireParams{
		Owner: owner, LeaseSeconds: 3600, MaxPartitions: 1 << 20,
	})
	if err != nil {
		return 0, fmt.Errorf("take partitions: %w", err)
	}
	var fence outboxdb.OutboxConfirmParams
	fence.Owner = owner
	for _, p := range owned {
		fence.FencePartitions = append(fence.FencePartitions, p.Partition)
		fence.FenceEpochs = append(fence.FenceEpochs, p.Epoch)
	}
	defer func() {
		if _, gerr := q.RelayPartitionsGiveBack(context.WithoutCancel(ctx), outboxdb.RelayPartitionsGiveBackParams{
			Owner: owner, Partitions: fence.FencePartitions,
		}); gerr != nil && err == nil {
			err = fmt.Errorf("give back partitions: %w", gerr)
		}
	}()
	var (
		floor     time.Time
		nextFloor time.Time
		flying    []outboxdb.OutboxReadRow // with the broker
		done      chan sent                // answers flying; nil when nothing is with the broker
		next      []outboxdb.OutboxReadRow // read, not yet sent
		answered  *outboxdb.OutboxConfirmParams
	)
	toConfirm := func(s sent) (*outboxdb.OutboxConfirmParams, error) {
		if s.err != nil {
			return nil, s.err
		}
		p := fence
		p.Partitions, p.Offsets = s.partitions, s.offsets
		for _, r := range s.rows {
			p.EventIDs = append(p.EventIDs, r.EventID)
		}
		return &p, nil
	}
	for {
		if done != nil {
			s := <-done
			done, flying = nil, nil
			if answered, err = toConfirm(s); err != nil {
				return n, err
			}
		}
		switch {
		case len(next) == 0:
		case overlap:
			flying, next = next, nil
			done = make(chan sent, 1)
			go func(rows []outboxdb.OutboxReadRow, done chan<- sent) {
				parts, offsets, err := send(ctx, rows)
				done <- sent{rows: rows, partitions: parts, offsets: offsets, err: err}
			}(flying, done)
		default:
			parts, offsets, err := send(ctx, next)
			if answered, err = toConfirm(sent{rows: next, partitions: parts, offsets: offsets, err: err}); err != nil {
				return n, err
			}
			next = nil
		}
		now := time.Now()
		if !now.Before(nextFloor) {
			if done != nil {
				// The upkeep waits for the batch with the broker, as the
				// relay's does; what was answered is confirmed alone.
				if answered != nil {
					ids, err := outboxdb.OutboxConfirmRelaxed(ctx, db, *answered)
					if err != nil {
						return n, fmt.Errorf("confirm: %w", err)
					}
					n, answered = n+len(ids), nil
				}
				continue
			}
			// Where reads start, found again about once a second, as the
			// relay does at each upkeep.
			floor, err = q.OutboxReadFloor(ctx, outboxdb.OutboxReadFloorParams{Partitions: fence.FencePartitions, LateSeconds: 5})
			if err != nil {
				return n, fmt.Errorf("read floor: %w", err)
			}
			nextFloor = now.Add(time.Second)
		}
		from, skip := readBeside(floor, flying)
		read := outboxdb.OutboxReadParams{
			Partitions: fence.FencePartitions, ReadFloor: from, InFlight: skip, IndependentTypes: []string{}, BatchSize: int32(batch),
		}
		var rows []outboxdb.OutboxReadRow
		if answered == nil {
			rows, err = outboxdb.OutboxReadInIndexOrder(ctx, db, read)
			if err != nil {
				return n, fmt.Errorf("read: %w", err)
			}
		} else {
			var ids []uuid.UUID
			ids, rows, err = outboxdb.OutboxConfirmThenRead(ctx, db, *answered, read)
			if err != nil {
				return n, fmt.Errorf("confirm and read: %w", err)
			}
			n, answered = n+len(ids), nil
		}
		if len(rows) == 0 && done == nil {
			return n, nil
		}
		next = rows
	}
}

// readBeside is where a read beside flying, the batch with the broker,
// starts and which of its rows the read must skip, as the relay's own
// read beside a delivery does: from the latest row in flight, skipping
// the rows in flight that are due then.
func readBeside(floor time.Time, flying []outboxdb.OutboxReadRow) (time.Time, []uuid.UUID) {
	for _, r := range flying {
		if r.NextAttemptAt.After(floor) {
			floor = r.NextAttemptAt
		}
	}
	skip := []uuid.UUID{}
	for _, r := range flying {
		if !r.NextAttemptAt.Before(floor) {
			skip = append(skip, r.EventID)
		}
	}
	return floor, skip
}
