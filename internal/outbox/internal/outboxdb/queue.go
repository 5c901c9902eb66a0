package outboxdb

import "github.com/jackc/pgx/v5"

// Written by hand beside the generated code: OutboxInsert as one statement
// of a pgx.Batch, so a service can send its own rows and its events to the
// database in one round trip. It reuses the generated statement; keep the
// arguments and the scan in step with OutboxInsert.

// QueueOutboxInsert adds OutboxInsert to b. When the batch runs, the rows
// the statement returns are appended to *dst, unless dst is nil.
func QueueOutboxInsert(b *pgx.Batch, arg OutboxInsertParams, dst *[]OutboxInsertRow) {
	b.Queue(outboxInsert,
		arg.OneRoundTrip,
		arg.EventIDs,
		arg.AggregateTypes,
		arg.AggregateIDs,
		arg.AggregateVersions,
		arg.EventTypes,
		arg.SchemaVersions,
		arg.Payloads,
		arg.Traceparents,
		arg.Tracestates,
	).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var i OutboxInsertRow
			if err := rows.Scan(&i.EventID, &i.PublishMode, &i.CreatedAt); err != nil {
				return err
			}
			if dst != nil {
				*dst = append(*dst, i)
			}
		}
		return rows.Err()
	})
}
