package ordersdb

import "github.com/jackc/pgx/v5"

// Written by hand beside the generated code: the statements of a new order
// as parts of one pgx.Batch, so the order, its lines, its events and its
// idempotency key reach the database in one round trip. They reuse the
// generated statements; keep the arguments and the scans in step with
// OrderInsert, OrderLinesInsert and IdempotencyKeyInsert.

// QueueOrderInsert adds OrderInsert to b; the returned row lands in *dst.
func QueueOrderInsert(b *pgx.Batch, arg OrderInsertParams, dst *Order) {
	b.Queue(orderInsert,
		arg.ID,
		arg.Customer,
		arg.Email,
		arg.Currency,
		arg.TotalCents,
		arg.Now,
	).QueryRow(func(row pgx.Row) error {
		return row.Scan(
			&dst.ID,
			&dst.Customer,
			&dst.Email,
			&dst.Currency,
			&dst.Status,
			&dst.TotalCents,
			&dst.Version,
			&dst.CreatedAt,
			&dst.UpdatedAt,
		)
	})
}

// QueueOrderLinesInsert adds OrderLinesInsert to b; the returned rows are
// appended to *dst.
func QueueOrderLinesInsert(b *pgx.Batch, arg OrderLinesInsertParams, dst *[]OrderLine) {
	b.Queue(orderLinesInsert,
		arg.OrderID,
		arg.LineNos,
		arg.SKUs,
		arg.Quantities,
		arg.UnitPricesCents,
	).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var i OrderLine
			if err := rows.Scan(
				&i.OrderID,
				&i.LineNo,
				&i.SKU,
				&i.Quantity,
				&i.UnitPriceCents,
			); err != nil {
				return err
			}
			*dst = append(*dst, i)
		}
		return rows.Err()
	})
}

// QueueIdempotencyKeyInsert adds IdempotencyKeyInsert to b.
func QueueIdempotencyKeyInsert(b *pgx.Batch, arg IdempotencyKeyInsertParams) {
	b.Queue(idempotencyKeyInsert,
		arg.Customer,
		arg.Key,
		arg.RequestHash,
		arg.OrderID,
	)
}
