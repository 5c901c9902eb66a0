package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

// A consumer's business change runs in the same transaction as the inbox's
// marker: a record delivered twice changes the state once.
func ExampleInbox_Handle() {
	ctx := context.Background()
	pool, done := exampleDB() // a database with the inbox's migrations applied
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE invoice_totals (invoice_id text PRIMARY KEY, total_cents bigint NOT NULL)`); err != nil {
		panic(err)
	}

	ib, err := inbox.New(inbox.Config{
		Pool:      pool,
		GapWindow: time.Minute,
		Apply: func(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
			var p struct {
				TotalCents int64 `json:"total_cents"`
			}
			if err := json.Unmarshal(e.Payload, &p); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO invoice_totals VALUES ($1, $2)
				ON CONFLICT (invoice_id) DO UPDATE SET total_cents = invoice_totals.total_cents + EXCLUDED.total_cents`,
				e.AggregateID, p.TotalCents)
			return err
		},
	})
	if err != nil {
		panic(err)
	}

	// A record as the outbox relay writes it, delivered twice.
	rec := cloudevents.Record("invoices.events", cloudevents.Event{
		ID: uuid.New(), Type: "invoice.issued", Source: "urn:example:invoices", Time: time.Now(),
		AggregateType: "invoice", AggregateID: "inv-1", AggregateVersion: 1, SchemaVersion: 1,
		Data: []byte(`{"total_cents": 1200}`),
	})
	for range 2 {
		e, err := inbox.DecodeRecord(rec) // a decode error means: park the record
		if err != nil {
			panic(err)
		}
		res, err := ib.Handle(ctx, e)
		if err != nil {
			panic(err) // the transaction rolled back; the record is retried
		}
		fmt.Println(res.Outcome)
	}
	var total int64
	if err := pool.QueryRow(ctx, `SELECT total_cents FROM invoice_totals WHERE invoice_id = 'inv-1'`).Scan(&total); err != nil {
		panic(err)
	}
	fmt.Println("total:", total)
	// Output:
	// applied
	// duplicate
	// total: 1200
}
