package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/orders/internal/outbox"
)

// The examples are an invoicing service, to show that nothing in the
// package is about orders. It has one event type.
var invoiceIssued = outbox.EventType{
	Name:     "invoice.issued",
	Ordering: outbox.Strict,
	Schemas: map[int][]byte{1: []byte(`{
		"type": "object",
		"required": ["invoice_id", "total_cents"],
		"properties": {"invoice_id": {"type": "string"}, "total_cents": {"type": "integer", "minimum": 0}}
	}`)},
}

// Writing events in the business transaction. The Writer is built once;
// Insert joins the caller's transaction, so the invoice and its event
// commit or roll back together. A refused event writes nothing.
func ExampleWriter_Insert() {
	pool, done := exampleDB()
	defer done()
	ctx := context.Background()

	// This service writes its payloads as JSON text, so Insert checks
	// them against their schemas too. A service that builds them from
	// typed values and validates each kind in its tests leaves the option
	// out (see WithSchemaCheckOnInsert).
	w, err := outbox.NewWriter([]outbox.EventType{invoiceIssued}, outbox.WithSchemaCheckOnInsert())
	if err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	var version int64
	err = tx.QueryRow(ctx, `INSERT INTO invoices (id, total_cents) VALUES ('inv-42', 1200) RETURNING version`).Scan(&version)
	if err != nil {
		log.Fatal(err)
	}
	err = w.Insert(ctx, tx, []outbox.Event{{
		AggregateType:    "invoice",
		AggregateID:      "inv-42",
		AggregateVersion: version, // from the row being committed
		Type:             "invoice.issued",
		SchemaVersion:    1,
		Payload:          json.RawMessage(`{"invoice_id": "inv-42", "total_cents": 1200}`),
	}})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	// An event that breaks its schema is refused before anything is
	// written; the caller rolls back its business change.
	tx, err = pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // rolled back on purpose
	err = w.Insert(ctx, tx, []outbox.Event{{
		AggregateType: "invoice", AggregateID: "inv-43", AggregateVersion: 1,
		Type: "invoice.issued", SchemaVersion: 1, Payload: json.RawMessage(`{"invoice_id": "inv-43"}`),
	}})
	var invalid *outbox.InvalidEventError
	if errors.As(err, &invalid) {
		fmt.Println("refused:", invalid.Field, invalid.Reason)
	}

	var pending int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE state = 'pending'`).Scan(&pending); err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending events:", pending)
	// Output:
	// refused: Payload fails JSON Schema invoice.issued v1 at / (required)
	// pending events: 1
}

// exampleDB gives an example a fresh database holding the outbox table and,
// standing in for a service's own tables, an invoices table. done drops
// it. Without PostgreSQL the example stops with a message saying how to
// point it at a server.
func exampleDB() (pool *pgxpool.Pool, done func()) {
	db, drop, err := createTestDB()
	if err != nil {
		log.Fatal(err)
	}
	_, err = db.Pool.Exec(context.Background(),
		`CREATE TABLE invoices (id text PRIMARY KEY, total_cents bigint NOT NULL, version bigint NOT NULL DEFAULT 1)`)
	if err != nil {
		log.Fatal(err)
	}
	return db.Pool, func() {
		if err := drop(); err != nil {
			log.Print(err)
		}
	}
}
