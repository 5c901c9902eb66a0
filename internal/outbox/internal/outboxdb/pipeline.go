package outboxdb

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Written by hand beside the generated code: the relay's read and confirm,
// each sent with the session settings it needs in one pgx.Batch. A batch
// ends with a single Sync, so its statements run in one implicit
// transaction, and a setting made local with set_config(..., true) holds
// for the statement after it and ends with the batch. One round trip
// instead of four (BEGIN, the setting, the statement, COMMIT): at
// thousands of events a second in batches of a hundred, the round trips
// are a good part of the relay's time. They reuse the generated
// statements; keep the arguments and the scans in step with OutboxRead and
// OutboxConfirm.

// Batcher is what runs a pgx.Batch: a *pgxpool.Pool, a *pgxpool.Conn, a
// *pgx.Conn.
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// RelaxedCommit is set before the relay's confirm and release: they commit
// without waiting for the WAL flush (see the relay's inRelayTx).
const RelaxedCommit = "SELECT set_config('synchronous_commit', 'off', true)"

// OutboxReadInIndexOrder runs OutboxRead after ClaimInIndexOrder, in one
// round trip.
func OutboxReadInIndexOrder(ctx context.Context, db Batcher, arg OutboxReadParams) ([]OutboxReadRow, error) {
	b := &pgx.Batch{}
	b.Queue(ClaimInIndexOrder)
	items := []OutboxReadRow{}
	b.Queue(outboxRead,
		arg.Partitions,
		arg.InFlight,
		arg.IndependentTypes,
		arg.BatchSize,
	).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var i OutboxReadRow
			if err := rows.Scan(
				&i.EventID,
				&i.AggregateType,
				&i.AggregateID,
				&i.AggregateVersion,
				&i.EventType,
				&i.SchemaVersion,
				&i.Payload,
				&i.Traceparent,
				&i.Tracestate,
				&i.CreatedAt,
				&i.Attempts,
				&i.NextAttemptAt,
				&i.PublishMode,
				&i.RelayPartition,
			); err != nil {
				return err
			}
			items = append(items, i)
		}
		return rows.Err()
	})
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	return items, nil
}

// OutboxConfirmRelaxed runs OutboxConfirm after RelaxedCommit, in one
// round trip.
func OutboxConfirmRelaxed(ctx context.Context, db Batcher, arg OutboxConfirmParams) ([]uuid.UUID, error) {
	b := &pgx.Batch{}
	b.Queue(RelaxedCommit)
	items := []uuid.UUID{}
	b.Queue(outboxConfirm,
		arg.EventIDs,
		arg.Partitions,
		arg.Offsets,
		arg.FencePartitions,
		arg.FenceEpochs,
		arg.Owner,
	).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var id uuid.UUID
			if err := rows.Scan(&id); err != nil {
				return err
			}
			items = append(items, id)
		}
		return rows.Err()
	})
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	return items, nil
}
