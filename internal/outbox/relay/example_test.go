package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
	"github.com/outboxref/orders/internal/outbox/relay"
)

// The examples are an invoicing service, to show that nothing in the
// relay is about orders. It has one event type.
var invoiceIssued = outbox.EventType{
	Name:     "invoice.issued",
	Ordering: outbox.Strict,
	Schemas: map[int][]byte{1: []byte(`{
		"type": "object",
		"required": ["invoice_id", "total_cents"],
		"properties": {"invoice_id": {"type": "string"}, "total_cents": {"type": "integer", "minimum": 0}}
	}`)},
}

// Running a relay beside the service. It delivers committed events to
// Kafka, keyed by aggregate id with CloudEvents headers, until its context
// ends; then it stops gracefully.
func ExampleRelay_Run() {
	pool, done := exampleDB()
	defer done()
	broker, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	issueInvoice(pool, "inv-42", 1200)

	kafka := []kgo.Opt{kgo.SeedBrokers(broker.ListenAddrs()...)} // plus TLS and SASL in production
	logger := slog.New(slog.DiscardHandler)                      // the service's logger
	ctx, stop := context.WithCancel(context.Background())

	go relay.EnsureTopic(ctx, kafka, "invoices.events", 3, logger) //nolint:errcheck // it logs; start-up never waits (O3)
	r, err := relay.NewRelay(relay.Config{
		Pool:   pool,
		Kafka:  kafka,
		Topic:  "invoices.events",
		Source: "urn:example:invoices",
		Types:  []outbox.EventType{invoiceIssued},
		Logger: logger,
	})
	if err != nil {
		log.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- r.Run(ctx) }()
	r.Nudge() // after each commit that wrote events; polling covers the rest

	rec := firstRecord(kafka, "invoices.events")
	e, err := cloudevents.Decode(rec)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(rec.Key), e.Type, e.AggregateVersion, string(e.Data))

	stop() // claims nothing more, releases its leases, flushes the producer
	if err := <-stopped; err != nil {
		log.Fatal(err)
	}
	// Output:
	// inv-42 invoice.issued 1 {"invoice_id": "inv-42", "total_cents": 1200}
}

// Creating the relay's topic. A service runs EnsureTopic in a goroutine
// (go relay.EnsureTopic(…)) so that a broker outage never delays its
// start-up; here the example waits for it and looks at the result.
func ExampleEnsureTopic() {
	broker, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	kafka := []kgo.Opt{kgo.SeedBrokers(broker.ListenAddrs()...)}
	ctx := context.Background()

	if err := relay.EnsureTopic(ctx, kafka, "invoices.events", 6, slog.New(slog.DiscardHandler)); err != nil {
		log.Fatal(err)
	}

	cl, err := kgo.NewClient(kafka...)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	topics, err := kadm.NewClient(cl).ListTopics(ctx, "invoices.events")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("invoices.events partitions:", len(topics["invoices.events"].Partitions))
	// Output:
	// invoices.events partitions: 6
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

// issueInvoice commits an invoice and its invoice.issued event, as
// ExampleWriter_Insert shows.
func issueInvoice(pool *pgxpool.Pool, id string, totalCents int64) {
	ctx := context.Background()
	w, err := outbox.NewWriter([]outbox.EventType{invoiceIssued})
	if err != nil {
		log.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, `INSERT INTO invoices (id, total_cents) VALUES ($1, $2)`, id, totalCents); err != nil {
		log.Fatal(err)
	}
	payload, err := json.Marshal(map[string]any{"invoice_id": id, "total_cents": totalCents})
	if err != nil {
		log.Fatal(err)
	}
	err = w.Insert(ctx, tx, []outbox.Event{{AggregateType: "invoice", AggregateID: id, AggregateVersion: 1,
		Type: "invoice.issued", SchemaVersion: 1, Payload: payload}})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}

// firstRecord reads the first record of topic, as a consumer would, giving
// up after a minute.
func firstRecord(kafka []kgo.Opt, topic string) *kgo.Record {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(append(slices.Clone(kafka), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			log.Fatalf("no record on %s within a minute", topic)
		}
		if recs := fs.Records(); len(recs) > 0 {
			return recs[0]
		}
	}
}
