// Package drainloop drains the outbox with the relay's own read and
// confirm statements and no broker: take every partition, read a batch,
// confirm it at made-up broker positions under the partitions' epochs,
// repeat. It is the ceiling a relay's throughput is measured against
// (cmd/bench): what the relay could reach if sending cost nothing. It is
// for benchmarks only; it marks rows delivered that were never sent, and
// it must not run beside a relay on the same database.
//
// It lives in the outbox's directory because the statements it runs are
// the outbox's generated code, which is private to the unit.
package drainloop

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

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
func Drain(ctx context.Context, db DB, batch int) (n int, err error) {
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
		offset    int64
		floor     time.Time
		nextFloor time.Time
		confirm   *outboxdb.OutboxConfirmParams // the batch read last, to confirm with the next read
	)
	for {
		if now := time.Now(); !now.Before(nextFloor) {
			// Where reads start, found again about once a second, as the
			// relay does at each upkeep.
			floor, err = q.OutboxReadFloor(ctx, outboxdb.OutboxReadFloorParams{Partitions: fence.FencePartitions, LateSeconds: 5})
			if err != nil {
				return n, fmt.Errorf("read floor: %w", err)
			}
			nextFloor = now.Add(time.Second)
		}
		read := outboxdb.OutboxReadParams{
			Partitions: fence.FencePartitions, ReadFloor: floor, InFlight: []uuid.UUID{}, IndependentTypes: []string{}, BatchSize: int32(batch),
		}
		var rows []outboxdb.OutboxReadRow
		if confirm == nil {
			rows, err = outboxdb.OutboxReadInIndexOrder(ctx, db, read)
			if err != nil {
				return n, fmt.Errorf("read: %w", err)
			}
		} else {
			var done []uuid.UUID
			done, rows, err = outboxdb.OutboxConfirmThenRead(ctx, db, *confirm, read)
			if err != nil {
				return n, fmt.Errorf("confirm and read: %w", err)
			}
			n += len(done)
		}
		if len(rows) == 0 {
			return n, nil
		}
		p := fence
		p.EventIDs, p.Partitions, p.Offsets = nil, nil, nil
		for _, r := range rows {
			p.EventIDs = append(p.EventIDs, r.EventID)
			p.Partitions = append(p.Partitions, int32(offset%6))
			p.Offsets = append(p.Offsets, offset)
			offset++
		}
		confirm = &p
	}
}
