package inbox_test

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

// A record the consumer could not read is parked; once the consumer reads
// it (here: schema version 2), an operator retries it. The retry runs in
// the operator's transaction, so an audit row written beside it commits
// with it or not at all.
func ExampleInbox_RetryParked() {
	ctx := context.Background()
	pool, done := exampleDB() // a database with the inbox's migrations applied
	defer done()
	ib, err := inbox.New(inbox.Config{Pool: pool, GapWindow: time.Minute,
		Apply: func(ctx context.Context, tx pgx.Tx, e inbox.Event) error { return nil }})
	if err != nil {
		panic(err)
	}

	// The consumer of yesterday read version 1 only, and parked this record.
	rec := cloudevents.Record("invoices.events", cloudevents.Event{
		ID: uuid.New(), Type: "invoice.issued", Source: "urn:example:invoices", Time: time.Now(),
		AggregateType: "invoice", AggregateID: "inv-1", AggregateVersion: 1, SchemaVersion: 2,
		Data: []byte(`{"total": {"cents": 1200}}`),
	})
	if _, err := inbox.ParkRecord(ctx, pool, rec, "invoice.issued schema version 2 is not supported"); err != nil {
		panic(err)
	}
	parked, err := inbox.ParkedRecords(ctx, pool, inbox.ParkedListOptions{Limit: 10})
	if err != nil {
		panic(err)
	}
	fmt.Println("parked:", len(parked), parked[0].Reason)

	// Today's consumer reads version 2: the retry decodes the parked bytes
	// with it and runs the event through the inbox.
	decode := func(r *kgo.Record) (inbox.Event, error) { return inbox.DecodeRecord(r) }
	var retry inbox.Retry
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		retry, err = ib.RetryParked(ctx, tx, parked[0].ID, "alice", "v2 reader deployed", decode)
		// ... write the audit row here, with retry.BeforeSHA256 and AfterSHA256.
		return err
	})
	if err != nil {
		panic(err)
	}
	ib.Observe(retry.Result) // after the commit
	fmt.Println(retry.Resolution, retry.Result.Outcome, retry.Record.ResolvedBy)
	// Output:
	// parked: 1 invoice.issued schema version 2 is not supported
	// applied applied alice
}
