// Package invoices is a small invoicing service built on the two reusable
// units of this repository, internal/outbox and internal/inbox, used as they
// are. It is the template a team copies when it adopts them
// (docs/adopting.md walks through it), and the proof that neither package
// knows anything about orders (L3).
//
// The service does two things:
//
//   - Issue writes an invoice and its invoice.issued event in one PostgreSQL
//     transaction, through outbox.Writer.Insert. That closes the dual-write
//     window: the invoice and its event commit or roll back together.
//   - Run delivers the committed events to Kafka with an relay.Relay
//     (at least once, keyed by invoice id), and consumes them into a ledger,
//     invoice_totals, through an inbox.Inbox. That closes the redelivery
//     window: the inbox marker commits with the ledger update, so a record
//     delivered twice is counted once, and offsets are committed only after
//     the local commit.
//
// Producer and consumer share one database here to keep the example short;
// in production the consumer is usually another service with a database of
// its own, and each side applies only its package's migration line.
//
// Its API: Config, New, Service (Issue, Total, Run), IssueInvoice, Invoice,
// CustomerTotal, EventTypes and EventIssued, Migrate, MigrationStatus and
// MigrationState, MigrationLine, and the errors ErrInvalidInvoice and
// ErrNotFound.
package invoices

import (
	"cmp"
	"context"
	_ "embed" // the event's JSON Schema
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/examples/invoices/invoicesdb"
	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/operate"
	"github.com/outboxref/orders/internal/outbox/relay"
)

// EventIssued is the event type written when an invoice is issued. Its
// payload is a public contract, described by schemas/invoice.issued.v1.json.
const EventIssued = "invoice.issued"

// aggregateType is the outbox aggregate_type of every invoice event.
const aggregateType = "invoice"

//go:embed schemas/invoice.issued.v1.json
var issuedV1Schema []byte

// EventTypes lists the events this service writes, with their ordering
// policy and JSON Schemas; the Writer and the Relay are built from the same
// list. invoice.issued is strict: any later event of an invoice (a void, a
// payment) must never reach consumers before the invoice was issued.
func EventTypes() []outbox.EventType {
	return []outbox.EventType{
		{Name: EventIssued, Ordering: outbox.Strict, Schemas: map[int][]byte{1: issuedV1Schema}},
	}
}

// issuedV1 is the payload of invoice.issued, schema version 1: only what
// consumers need (W5).
type issuedV1 struct {
	InvoiceID  string `json:"invoice_id"`
	Customer   string `json:"customer"`
	TotalCents int64  `json:"total_cents"`
}

// Defaults of Config's zero values.
const (
	// DefaultTopic is the topic the events go to.
	DefaultTopic = "invoices.events"
	// DefaultPartitions is the partition count EnsureTopic creates the
	// topic with. It is fixed for the topic's life: adding partitions
	// would move an invoice's later events to another partition.
	DefaultPartitions = 3
	// DefaultGroup is the ledger's consumer group.
	DefaultGroup = "invoices-ledger"
	// DefaultSource is the events' ce_source.
	DefaultSource = "urn:example:invoices"
	// DefaultProcessedEventTTL, DefaultBrokerRedelivery and
	// DefaultBackupRetention satisfy inbox.CheckRetention: markers outlive
	// the broker's redelivery window plus the age of the oldest backup (C5).
	DefaultProcessedEventTTL = 30 * 24 * time.Hour
	DefaultBrokerRedelivery  = 7 * 24 * time.Hour
	DefaultBackupRetention   = 14 * 24 * time.Hour
	// DefaultOutboxRetention is how long delivered outbox rows stay
	// (replays read them) before the cleanup archives them.
	DefaultOutboxRetention = 7 * 24 * time.Hour
	// DefaultMaintenanceInterval is how often the inbox's gauges are
	// refreshed and expired rows deleted.
	DefaultMaintenanceInterval = time.Minute
)

// maxCustomerBytes bounds a customer id, as the JSON Schema does.
const maxCustomerBytes = 200

// Errors of the service. A caller tells them apart with errors.Is.
var (
	// ErrInvalidInvoice matches an IssueInvoice command that is refused
	// before anything is written.
	ErrInvalidInvoice = errors.New("invoices: invalid invoice")
	// ErrNotFound matches a customer with nothing in the ledger yet.
	ErrNotFound = errors.New("invoices: not found")
)

// Config configures a Service. Zero values take the defaults above.
type Config struct {
	// Pool is the service's database, migrated with Migrate.
	Pool *pgxpool.Pool
	// Kafka holds the options that reach the cluster: seed brokers, TLS,
	// SASL. The relay, the topic creation and the ledger's consumer each
	// build their own client from them.
	Kafka []kgo.Opt
	// Topic receives the events; Partitions is used only when EnsureTopic
	// creates it.
	Topic      string
	Partitions int
	// Group is the ledger's consumer group.
	Group string
	// Source is the events' CloudEvents source (ce_source).
	Source string

	// ProcessedEventTTL is how long the inbox keeps a processed event's
	// marker. New refuses a TTL shorter than BrokerRedelivery plus
	// BackupRetention (C5).
	ProcessedEventTTL time.Duration
	// BrokerRedelivery is the longest the broker may deliver an event
	// again: the topic's retention, or the longest replay you allow.
	BrokerRedelivery time.Duration
	// BackupRetention is the age of the oldest backup the database may be
	// restored from.
	BackupRetention time.Duration
	// OutboxRetention is how long a delivered outbox row stays before the
	// cleanup moves its identity to outbox_archive and deletes it.
	OutboxRetention time.Duration
	// MaintenanceInterval is how often the inbox's gauges are refreshed and
	// expired rows deleted.
	MaintenanceInterval time.Duration

	// Registerer receives the outbox's and the inbox's metrics; nil keeps
	// them in a registry of their own, unexported.
	Registerer prometheus.Registerer
	// Logger receives structured logs; slog.Default() when nil.
	Logger *slog.Logger
}

// Service issues invoices and keeps the ledger.
type Service struct {
	cfg    Config
	q      *invoicesdb.Queries
	writer *outbox.Writer
	relay  *relay.Relay
	admin  *operate.Admin // operations: the outbox's cleanup here
	inbox  *inbox.Inbox
	log    *slog.Logger
	ran    atomic.Bool
}

// New checks cfg, builds the outbox writer and relay and the inbox, and
// registers their metrics. Nothing runs until Run.
func New(cfg Config) (*Service, error) {
	if cfg.Pool == nil {
		return nil, errors.New("invoices: Pool is required")
	}
	cfg.Topic = cmp.Or(cfg.Topic, DefaultTopic)
	cfg.Partitions = cmp.Or(cfg.Partitions, DefaultPartitions)
	cfg.Group = cmp.Or(cfg.Group, DefaultGroup)
	cfg.Source = cmp.Or(cfg.Source, DefaultSource)
	cfg.ProcessedEventTTL = cmp.Or(cfg.ProcessedEventTTL, DefaultProcessedEventTTL)
	cfg.BrokerRedelivery = cmp.Or(cfg.BrokerRedelivery, DefaultBrokerRedelivery)
	cfg.BackupRetention = cmp.Or(cfg.BackupRetention, DefaultBackupRetention)
	cfg.OutboxRetention = cmp.Or(cfg.OutboxRetention, DefaultOutboxRetention)
	cfg.MaintenanceInterval = cmp.Or(cfg.MaintenanceInterval, DefaultMaintenanceInterval)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	// A marker deleted while the broker can still redeliver its event
	// turns the redelivery into a second ledger entry: refuse to start.
	if err := inbox.CheckRetention(cfg.ProcessedEventTTL, cfg.BrokerRedelivery, cfg.BackupRetention); err != nil {
		return nil, err
	}

	// Each insert checks the payload against its schema too: this example
	// has no test that runs every payload Issue builds through
	// Writer.Validate, which is what lets a service leave the check out.
	writer, err := outbox.NewWriter(EventTypes(), outbox.WithSchemaCheckOnInsert())
	if err != nil {
		return nil, fmt.Errorf("invoices: %w", err)
	}
	// The relay's lease, batch size, poll interval and backoff keep their
	// defaults here; relay.Config documents each.
	rl, err := relay.NewRelay(relay.Config{
		Pool:       cfg.Pool,
		Kafka:      cfg.Kafka,
		Topic:      cfg.Topic,
		Source:     cfg.Source,
		Types:      EventTypes(), // the Writer's list
		Logger:     cfg.Logger,
		Registerer: cfg.Registerer,
	})
	if err != nil {
		return nil, fmt.Errorf("invoices: %w", err)
	}

	s := &Service{cfg: cfg, q: invoicesdb.New(cfg.Pool), writer: writer, relay: rl, log: cfg.Logger,
		admin: operate.NewAdmin(cfg.Pool, writer)}
	if err := cfg.Registerer.Register(s.admin.Collector()); err != nil {
		return nil, fmt.Errorf("invoices: %w", err)
	}
	s.inbox, err = inbox.New(inbox.Config{
		Pool:  cfg.Pool,
		Apply: s.apply,
		// Every invoice has one event, at version 1, so an invoice never has
		// a gap to resynchronise: Fetch stays nil, and the window only
		// matters if a version is ever missing.
		GapWindow:  time.Minute,
		Registerer: cfg.Registerer,
		Logger:     cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("invoices: %w", err)
	}
	// Series at zero from the start, so "did duplicates rise?" has an answer.
	s.inbox.Metrics().InitEventTypes(EventIssued)
	return s, nil
}

// IssueInvoice is the command that issues an invoice.
type IssueInvoice struct {
	// Customer is the customer's id (never a name or an address: it
	// travels in the event).
	Customer   string
	TotalCents int64
	// Traceparent is the W3C trace context of the request, if any; it is
	// stored with the event and travels in the record.
	Traceparent string
}

func (c IssueInvoice) validate() error {
	switch {
	case c.Customer == "" || len(c.Customer) > maxCustomerBytes || !utf8.ValidString(c.Customer):
		return fmt.Errorf("%w: customer must be 1 to %d bytes of UTF-8", ErrInvalidInvoice, maxCustomerBytes)
	case hasControl(c.Customer):
		return fmt.Errorf("%w: customer holds a control character", ErrInvalidInvoice)
	case c.TotalCents < 0:
		return fmt.Errorf("%w: total_cents %d is negative", ErrInvalidInvoice, c.TotalCents)
	}
	return nil
}

func hasControl(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return true
		}
	}
	return false
}

// Invoice is an issued invoice as committed.
type Invoice struct {
	ID         uuid.UUID
	Customer   string
	TotalCents int64
	Status     string
	// Version is the invoice's aggregate version, the one its latest
	// event carries.
	Version  int64
	IssuedAt time.Time
}

// Issue writes the invoice and its invoice.issued event in one
// transaction, then nudges the relay. If anything fails, both roll back:
// there is never an invoice without its event, nor an event for an
// invoice that does not exist. The event is not sent here (W2): the relay
// sends it after the commit.
func (s *Service) Issue(ctx context.Context, cmd IssueInvoice) (Invoice, error) {
	if err := cmd.validate(); err != nil {
		return Invoice{}, err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Invoice{}, fmt.Errorf("issue invoice: generate id: %w", err)
	}
	var inv invoicesdb.Invoice
	err = pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		inv, err = invoicesdb.New(tx).InvoiceInsert(ctx, invoicesdb.InvoiceInsertParams{
			ID: id, Customer: cmd.Customer, TotalCents: cmd.TotalCents,
		})
		if err != nil {
			return fmt.Errorf("insert invoice: %w", err)
		}
		// The payload comes from the row as committed (RETURNING), never
		// re-read after the commit (W5).
		payload, err := json.Marshal(issuedV1{InvoiceID: inv.ID.String(), Customer: inv.Customer, TotalCents: inv.TotalCents})
		if err != nil {
			return fmt.Errorf("encode %s payload: %w", EventIssued, err)
		}
		return s.writer.Insert(ctx, tx, []outbox.Event{{
			AggregateType:    aggregateType,
			AggregateID:      inv.ID.String(),
			AggregateVersion: inv.Version, // from the row being committed
			Type:             EventIssued,
			SchemaVersion:    1,
			Payload:          payload,
			Traceparent:      cmd.Traceparent,
		}})
	})
	if err != nil {
		// W7: name the command and the aggregate, and never claim that an
		// event was sent: nothing was committed.
		s.log.ErrorContext(ctx, "issue invoice failed; nothing was recorded and no event will be sent",
			"command", "issue_invoice", "invoice_id", id.String(), "error", err.Error())
		return Invoice{}, fmt.Errorf("issue invoice %s: %w", id, err)
	}
	s.relay.Nudge() // deliver now rather than at the next poll (R8)
	return Invoice{ID: inv.ID, Customer: inv.Customer, TotalCents: inv.TotalCents,
		Status: inv.Status, Version: inv.Version, IssuedAt: inv.IssuedAt}, nil
}

// CustomerTotal is one customer's line in the ledger.
type CustomerTotal struct {
	Customer   string
	Invoices   int64
	TotalCents int64
}

// Total returns what the ledger holds for customer, or ErrNotFound. The
// ledger is fed by the consumer, so it lags Issue by the delivery delay.
func (s *Service) Total(ctx context.Context, customer string) (CustomerTotal, error) {
	t, err := s.q.InvoiceTotalGet(ctx, customer)
	if errors.Is(err, pgx.ErrNoRows) {
		return CustomerTotal{}, fmt.Errorf("ledger of customer %q: %w", customer, ErrNotFound)
	}
	if err != nil {
		return CustomerTotal{}, fmt.Errorf("read ledger of customer %q: %w", customer, err)
	}
	return CustomerTotal{Customer: t.Customer, Invoices: t.Invoices, TotalCents: t.TotalCents}, nil
}

// Run runs the relay, the topic creation, the ledger's consumer and the
// inbox maintenance until ctx ends, then stops them gracefully: the relay
// releases its leases and flushes its producer (R9), the consumer commits
// the offsets of what it processed. It returns nil after a graceful stop,
// and an error if a part could not start, after stopping the others. Run
// may be called once: the relay cannot be restarted.
func (s *Service) Run(ctx context.Context) error {
	if !s.ran.CompareAndSwap(false, true) {
		return errors.New("invoices: Run called twice")
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()

	// Start-up never waits for the topic (O3): until it exists, the relay's
	// sends fail as unknown_topic and are retried like any broker outage.
	go func() {
		if err := relay.EnsureTopic(ctx, s.cfg.Kafka, s.cfg.Topic, s.cfg.Partitions, s.log); err != nil && ctx.Err() == nil {
			s.log.ErrorContext(ctx, "kafka topic not ensured", "topic", s.cfg.Topic, "error", err.Error())
		}
	}()

	var wg sync.WaitGroup
	var relayErr, consumeErr error
	wg.Go(func() {
		defer stop() // one part failing stops the others
		if relayErr = s.relay.Run(ctx); relayErr != nil {
			relayErr = fmt.Errorf("invoices relay: %w", relayErr)
		}
	})
	wg.Go(func() {
		defer stop()
		if consumeErr = s.consume(ctx); consumeErr != nil {
			consumeErr = fmt.Errorf("invoices ledger: %w", consumeErr)
		}
	})
	wg.Go(func() { s.maintain(ctx) })
	wg.Wait()
	return errors.Join(relayErr, consumeErr)
}

// maintain refreshes the inbox's gauges (they are read from its tables,
// and nothing else sets them) and deletes markers older than the retention,
// one instance at a time (O6), until ctx ends.
func (s *Service) maintain(ctx context.Context) {
	t := time.NewTicker(s.cfg.MaintenanceInterval)
	defer t.Stop()
	for {
		if _, err := s.inbox.RefreshStats(ctx); err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "refresh inbox gauges", "error", err.Error())
		}
		if _, err := s.inbox.Cleanup(ctx, s.cfg.ProcessedEventTTL, 1000, 100*time.Millisecond); err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "clean up processed events", "error", err.Error())
		}
		if _, err := s.admin.Cleanup(ctx, operate.Cleanup{Retention: s.cfg.OutboxRetention, BatchSize: 1000, Pause: 100 * time.Millisecond}); err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "clean up delivered outbox rows", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
