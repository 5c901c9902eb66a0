package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

// The reference outbox: Watermill's Forwarder component. Events are
// written by its SQL publisher (wrapped in the forwarder's envelope) into
// one table with the PostgreSQL schema and offsets adapters, the setup
// Watermill documents; forwarder.Forwarder reads that table through the SQL
// subscriber and publishes each event with watermill-kafka's publisher.
const (
	watermillSQLTopic = "orders_outbox"
	watermillGroup    = "bench_forwarder"
	// watermillLoadBatch is how many events one INSERT of the loader
	// carries (the SQL publisher writes all messages of one Publish in one
	// multi-row INSERT); watermillLoadTx is how many events share a
	// transaction while the backlog is loaded.
	watermillLoadBatch = 100
	watermillLoadTx    = 1000
)

var watermillSchema = wsql.DefaultPostgreSQLSchema{}
var watermillOffsets = wsql.DefaultPostgreSQLOffsetsAdapter{}

// outboxEvent is one outbox row as it is published: its key fields and
// its payload as stored.
type outboxEvent struct {
	ID            string
	AggregateType string
	AggregateID   string
	Version       int64
	Type          string
	Schema        int
	Payload       []byte
	CreatedAt     time.Time
}

// readOutbox reads every outbox row of db in creation order.
func readOutbox(ctx context.Context, pool *pgxpool.Pool) ([]outboxEvent, error) {
	rows, err := pool.Query(ctx, `SELECT event_id::text, aggregate_type, aggregate_id, aggregate_version,
			event_type, schema_version, payload::text, created_at
		FROM outbox ORDER BY created_at, aggregate_version`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxEvent, error) {
		var e outboxEvent
		var payload string
		err := r.Scan(&e.ID, &e.AggregateType, &e.AggregateID, &e.Version, &e.Type, &e.Schema, &payload, &e.CreatedAt)
		e.Payload = []byte(payload)
		return e, err
	})
}

// watermillMessage is the message an application using Watermill would
// publish for the event: its id, its payload, and as metadata (which
// watermill-kafka sends as headers) the headers the relay sends.
func watermillMessage(e outboxEvent) *message.Message {
	m := message.NewMessage(e.ID, e.Payload)
	for k, v := range map[string]string{
		cloudevents.HeaderSpecVersion:      cloudevents.SpecVersion,
		cloudevents.HeaderID:               e.ID,
		cloudevents.HeaderType:             e.Type,
		cloudevents.HeaderSource:           "urn:outboxref:orders",
		cloudevents.HeaderSubject:          e.AggregateID,
		cloudevents.HeaderTime:             e.CreatedAt.UTC().Format(time.RFC3339Nano),
		cloudevents.HeaderContentType:      "application/json",
		cloudevents.HeaderAggregateType:    e.AggregateType,
		cloudevents.HeaderAggregateVersion: strconv.FormatInt(e.Version, 10),
		cloudevents.HeaderSchemaVersion:    strconv.Itoa(e.Schema),
	} {
		m.Metadata.Set(k, v)
	}
	return m
}

// loadWatermill writes events into Watermill's forwarder table of db the
// way Watermill writes them: forwarder.NewPublisher around the SQL
// publisher on a transaction, as an application does in its business
// transaction (here many events per transaction, to load quickly; the
// subscriber reads the table in the same order whatever the grouping).
func loadWatermill(ctx context.Context, pool *pgxpool.Pool, events []outboxEvent) error {
	if err := initWatermillSchema(ctx, pool); err != nil {
		return err
	}
	for lo := 0; lo < len(events); lo += watermillLoadTx {
		chunk := events[lo:min(lo+watermillLoadTx, len(events))]
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			sqlPub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: watermillSchema}, watermill.NopLogger{})
			if err != nil {
				return err
			}
			pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: watermillSQLTopic})
			for i := 0; i < len(chunk); i += watermillLoadBatch {
				part := chunk[i:min(i+watermillLoadBatch, len(chunk))]
				msgs := make([]*message.Message, len(part))
				for j, e := range part {
					msgs[j] = watermillMessage(e)
					msgs[j].SetContext(ctx)
				}
				if err := pub.Publish(topic, msgs...); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("load the Watermill table: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE)"); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, "CHECKPOINT")
	return err
}

// initWatermillSchema creates the messages and offsets tables with the
// adapters' own statements.
func initWatermillSchema(ctx context.Context, pool *pgxpool.Pool) error {
	qs, err := watermillSchema.SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: watermillSQLTopic})
	if err != nil {
		return err
	}
	oqs, err := watermillOffsets.SchemaInitializingQueries(wsql.OffsetsSchemaInitializingQueriesParams{Topic: watermillSQLTopic})
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, q := range append(qs, oqs...) {
			if _, err := tx.Exec(ctx, q.Query, q.Args...); err != nil {
				return fmt.Errorf("watermill schema: %w", err)
			}
		}
		return nil
	})
}

// watermillSarama is watermill-kafka's default synchronous publisher
// configuration made as safe as the relay's producer: acknowledgement by
// every in-sync replica and the idempotent producer (which sarama allows
// only with one request in flight per broker).
func watermillSarama() *sarama.Config {
	c := kafka.DefaultSaramaSyncPublisherConfig()
	c.Version = sarama.V2_8_0_0
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Idempotent = true
	c.Net.MaxOpenRequests = 1
	c.Metadata.Retry.Backoff = 100 * time.Millisecond
	return c
}

// countingPublisher counts the messages its publisher accepted.
type countingPublisher struct {
	message.Publisher
	n atomic.Int64
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	p.n.Add(int64(len(msgs)))
	return nil
}

// watermillDrain runs a Forwarder over db's table until the consumer
// group's committed offset reaches the last row, and returns the time
// from its start to that commit.
func (b *bench) watermillDrain(ctx context.Context, db, brokerAddr string, n int) (time.Duration, error) {
	pool, err := b.pool(ctx, db)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	var lastTx uint64
	var lastOffset int64
	if err := pool.QueryRow(ctx, `SELECT transaction_id::text::bigint, "offset" FROM `+watermillSchema.MessagesTable(watermillSQLTopic)+
		` ORDER BY transaction_id DESC, "offset" DESC LIMIT 1`).Scan(&lastTx, &lastOffset); err != nil {
		return 0, fmt.Errorf("watermill table: %w", err)
	}

	logger := watermill.NopLogger{}
	start := time.Now()
	kpub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: []string{brokerAddr},
		Marshaler: kafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
			return m.Metadata.Get(cloudevents.HeaderSubject), nil
		}),
		OverwriteSaramaConfig: watermillSarama(),
	}, logger)
	if err != nil {
		return 0, fmt.Errorf("watermill kafka publisher: %w", err)
	}
	pub := &countingPublisher{Publisher: kpub}
	defer pub.Close()
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		ConsumerGroup:  watermillGroup,
		SchemaAdapter:  watermillSchema,
		OffsetsAdapter: watermillOffsets,
		PollInterval:   100 * time.Millisecond,
	}, logger)
	if err != nil {
		return 0, fmt.Errorf("watermill sql subscriber: %w", err)
	}
	defer sub.Close()
	fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: watermillSQLTopic})
	if err != nil {
		return 0, fmt.Errorf("watermill forwarder: %w", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- fwd.Run(rctx) }()

	var took time.Duration
	err = waitFor(ctx, b.opts.DrainTimeout, 20*time.Millisecond, nil, func(ctx context.Context) (bool, error) {
		select {
		case err := <-runErr:
			return false, fmt.Errorf("watermill forwarder stopped: %v", err)
		default:
		}
		var acked int64
		var tx uint64
		err := pool.QueryRow(ctx, `SELECT offset_acked, last_processed_transaction_id::text::bigint FROM `+
			watermillOffsets.MessagesOffsetsTable(watermillSQLTopic)+` WHERE consumer_group = $1`, watermillGroup).Scan(&acked, &tx)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if tx == lastTx && acked == lastOffset {
			took = time.Since(start)
			return true, nil
		}
		return false, nil
	})
	cancel()
	_ = fwd.Close()
	if err != nil {
		return 0, fmt.Errorf("watermill drain: %w", err)
	}
	if got := pub.n.Load(); got < int64(n) {
		return 0, fmt.Errorf("watermill forwarder published %d of %d events", got, n)
	}
	return took, nil
}
