package invoices_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/examples/invoices"
	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

var issued = map[string]string{"event_type": invoices.EventIssued}

// TestIssuedInvoiceReachesLedgerOnce follows one invoice through both
// packages: issued with its event in one transaction, delivered to Kafka by
// the relay, consumed once through the inbox, and a redelivered copy of the
// same record dropped as a duplicate and counted.
func TestIssuedInvoiceReachesLedgerOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()

	// Issued while nothing runs: the event waits in the outbox.
	inv := e.issue(t, "cust-1", 1250)
	require.EqualValues(t, 1, inv.Version)
	var invoiceTx, eventTx, state string
	var eventID uuid.UUID
	var payload []byte
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT xmin::text FROM invoices WHERE id = $1`, inv.ID).Scan(&invoiceTx))
	require.NoError(t, e.pool.QueryRow(ctx,
		`SELECT xmin::text, event_id, state, payload FROM outbox
		 WHERE aggregate_type = 'invoice' AND aggregate_id = $1 AND aggregate_version = 1 AND event_type = $2`,
		inv.ID.String(), invoices.EventIssued).Scan(&eventTx, &eventID, &state, &payload))
	require.Equal(t, invoiceTx, eventTx, "the invoice and its event must be written by one transaction")
	require.Equal(t, "pending", state)
	require.JSONEq(t, `{"invoice_id": "`+inv.ID.String()+`", "customer": "cust-1", "total_cents": 1250}`, string(payload))

	e.run(t)

	// Delivered: keyed by the invoice, with the outbox's event_id.
	rec := e.records(t, 1)[0]
	require.Equal(t, inv.ID.String(), string(rec.Key))
	ce, err := cloudevents.Decode(rec)
	require.NoError(t, err)
	require.Equal(t, eventID, ce.ID)
	require.Equal(t, invoices.EventIssued, ce.Type)
	require.EqualValues(t, 1, ce.AggregateVersion)
	require.Eventually(t, func() bool {
		return count(t, e.pool, `SELECT count(*) FROM outbox WHERE event_id = $1 AND state = 'delivered'`, eventID) == 1
	}, 30*time.Second, 20*time.Millisecond, "the relay confirms the row once the broker acknowledged it")

	// Consumed once, and its offset committed after the local commit.
	e.waitTotal(t, invoices.CustomerTotal{Customer: "cust-1", Invoices: 1, TotalCents: 1250})
	e.waitCommitted(t)
	require.Zero(t, e.metric(t, "inbox_duplicates_total", issued))

	// The same record again, as after a relay crash between the broker's
	// acknowledgement and the confirm (R3): absorbed, counted, not applied.
	e.produce(t, &kgo.Record{Key: rec.Key, Value: rec.Value, Headers: rec.Headers})
	require.Eventually(t, func() bool {
		return e.metric(t, "inbox_duplicates_total", issued) == 1
	}, 30*time.Second, 20*time.Millisecond, "the redelivered copy is counted as a duplicate")
	e.waitCommitted(t)
	got, err := e.svc.Total(ctx, "cust-1")
	require.NoError(t, err)
	require.Equal(t, invoices.CustomerTotal{Customer: "cust-1", Invoices: 1, TotalCents: 1250}, got)
	require.Equal(t, 1, count(t, e.pool, `SELECT count(*) FROM processed_event WHERE event_id = $1 AND outcome = 'applied'`, eventID))
}

// TestOffsetCommittedOnlyAfterLocalCommit holds the ledger's table locked so
// that a record's local transaction cannot commit, and checks that its
// offset is not committed meanwhile (C1), then that it is once the
// transaction commits.
func TestOffsetCommittedOnlyAfterLocalCommit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.run(t)
	e.issue(t, "cust-2", 100)
	e.waitTotal(t, invoices.CustomerTotal{Customer: "cust-2", Invoices: 1, TotalCents: 100})
	e.waitCommitted(t)

	lock, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer lock.Rollback(ctx) //nolint:errcheck // released below; a no-op then
	_, err = lock.Exec(ctx, `LOCK TABLE invoice_totals IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	e.issue(t, "cust-2", 200)
	require.Eventually(t, func() bool {
		return count(t, e.pool, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO invoice_totals%'`) == 1
	}, 30*time.Second, 20*time.Millisecond, "the consumer's transaction waits for the lock")
	require.EqualValues(t, 1, e.lag(t), "the record in hand is not committed before its local transaction is")

	require.NoError(t, lock.Rollback(ctx))
	e.waitTotal(t, invoices.CustomerTotal{Customer: "cust-2", Invoices: 2, TotalCents: 300})
	e.waitCommitted(t)
}

// TestPoisonRecordIsParked sends bytes that are no event into the ledger's
// only partition: they are parked with their reason, their offset is
// committed, and the next invoice behind them is applied (C6).
func TestPoisonRecordIsParked(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *invoices.Config) {
		c.Partitions = 1 // the poison and the next invoice share a partition
		c.MaintenanceInterval = 20 * time.Millisecond
	})
	e.run(t)
	e.issue(t, "cust-3", 1)
	e.waitTotal(t, invoices.CustomerTotal{Customer: "cust-3", Invoices: 1, TotalCents: 1})

	e.produce(t, &kgo.Record{Key: []byte("junk"), Value: []byte("not an event")})
	e.issue(t, "cust-3", 2)
	e.waitTotal(t, invoices.CustomerTotal{Customer: "cust-3", Invoices: 2, TotalCents: 3})
	e.waitCommitted(t)
	require.Equal(t, 1, count(t, e.pool,
		`SELECT count(*) FROM inbox_parked_record WHERE record_key = 'junk' AND record_value = 'not an event' AND reason LIKE '%ce_specversion%'`))
	require.Eventually(t, func() bool {
		return e.metric(t, "inbox_parked_records", nil) == 1
	}, 30*time.Second, 20*time.Millisecond, "the maintenance loop refreshes the parked-records gauge")
}

// TestConflictingEventIsRecordedNotApplied forges a record that claims an
// invoice's version 1 under another event_id: the inbox records and counts
// the conflict and never applies it.
func TestConflictingEventIsRecordedNotApplied(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.run(t)
	inv := e.issue(t, "cust-4", 500)
	e.waitTotal(t, invoices.CustomerTotal{Customer: "cust-4", Invoices: 1, TotalCents: 500})
	rec := e.records(t, 1)[0]

	forged := &kgo.Record{Key: rec.Key, Value: []byte(`{"invoice_id": "` + inv.ID.String() + `", "customer": "cust-4", "total_cents": 99999}`)}
	forgedID := uuid.New()
	for _, h := range rec.Headers {
		if h.Key == cloudevents.HeaderID {
			h.Value = []byte(forgedID.String())
		}
		forged.Headers = append(forged.Headers, h)
	}
	e.produce(t, forged)
	require.Eventually(t, func() bool {
		return e.metric(t, "inbox_conflicts_total", issued) == 1
	}, 30*time.Second, 20*time.Millisecond)
	e.waitCommitted(t)
	require.Equal(t, 1, count(t, e.pool, `SELECT count(*) FROM inbox_conflict WHERE event_id = $1`, forgedID))
	got, err := e.svc.Total(context.Background(), "cust-4")
	require.NoError(t, err)
	require.EqualValues(t, 500, got.TotalCents)
}

// TestIssueRefusesInvalidInvoice: a bad command is refused with
// ErrInvalidInvoice and writes nothing.
func TestIssueRefusesInvalidInvoice(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for name, cmd := range map[string]invoices.IssueInvoice{
		"NoCustomer":       {TotalCents: 1},
		"NegativeTotal":    {Customer: "cust-5", TotalCents: -1},
		"ControlCharacter": {Customer: "cust\x00", TotalCents: 1},
		"LongCustomer":     {Customer: string(make([]byte, 201)), TotalCents: 1},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := e.svc.Issue(context.Background(), cmd)
			require.ErrorIs(t, err, invoices.ErrInvalidInvoice)
		})
	}
	require.Zero(t, count(t, e.pool, `SELECT count(*) FROM invoices`))
	require.Zero(t, count(t, e.pool, `SELECT count(*) FROM outbox`))
}

// TestIssueRollsBackInvoiceWhenEventFails makes the outbox insert fail
// after the invoice was written (a trigger refuses it): the invoice rolls
// back with it (V1).
func TestIssueRollsBackInvoiceWhenEventFails(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `
		CREATE FUNCTION refuse_outbox() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'outbox insert refused by the test'; END $$;
		CREATE TRIGGER refuse_outbox BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION refuse_outbox();`)
	require.NoError(t, err)

	_, err = e.svc.Issue(ctx, invoices.IssueInvoice{Customer: "cust-6", TotalCents: 10})
	require.ErrorContains(t, err, "outbox insert refused by the test")
	require.Zero(t, count(t, e.pool, `SELECT count(*) FROM invoices`), "no invoice without its event")
}

// TestNewRefusesShortRetention: a processed_event retention shorter than
// the broker's redelivery window plus the backup retention is refused at
// start-up (C5).
func TestNewRefusesShortRetention(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), serverURL()) // connects lazily; New queries nothing
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = invoices.New(invoices.Config{
		Pool:              pool,
		ProcessedEventTTL: 7 * 24 * time.Hour,
		BrokerRedelivery:  7 * 24 * time.Hour,
		BackupRetention:   24 * time.Hour,
	})
	require.ErrorIs(t, err, inbox.ErrRetentionTooShort)
}

// TestMigrateAppliesEachLineOnce: the outbox's, the inbox's and the
// service's lines, each with its own version table, applied in that order
// and only once.
func TestMigrateAppliesEachLineOnce(t *testing.T) {
	t.Parallel()
	pool := newDB(t) // migrated once already
	ctx := context.Background()
	again, err := invoices.Migrate(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, again, "an up-to-date database gets nothing")

	st, err := invoices.MigrationStatus(ctx, pool)
	require.NoError(t, err)
	var lines []string
	for _, s := range st {
		require.True(t, s.Applied, "%s/%s", s.Line, s.File)
		if len(lines) == 0 || lines[len(lines)-1] != s.Line {
			lines = append(lines, s.Line)
		}
	}
	require.Equal(t, []string{"outbox", "inbox", invoices.MigrationLine}, lines)
	for _, table := range []string{"outbox_migrations", "inbox_migrations", "invoices_migrations"} {
		require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM pg_tables WHERE tablename = $1`, table), table)
	}
}

// TestSchemaIsTheContract: the writer built from EventTypes accepts the
// payload Issue writes and refuses one that breaks the published schema,
// inside the caller's transaction, before anything is written (L2).
func TestSchemaIsTheContract(t *testing.T) {
	t.Parallel()
	w, err := outbox.NewWriter(invoices.EventTypes())
	require.NoError(t, err)
	event := func(payload string) []outbox.Event {
		return []outbox.Event{{AggregateType: "invoice", AggregateID: "inv-1", AggregateVersion: 1,
			Type: invoices.EventIssued, SchemaVersion: 1, Payload: json.RawMessage(payload)}}
	}
	require.NoError(t, w.Validate(event(`{"invoice_id": "inv-1", "customer": "cust-7", "total_cents": 0}`)))
	for _, bad := range []string{
		`{"invoice_id": "inv-1", "total_cents": 0}`,
		`{"invoice_id": "inv-1", "customer": "cust-7", "total_cents": -1}`,
		`{"invoice_id": "inv-1", "customer": "", "total_cents": 1}`,
	} {
		require.ErrorIs(t, w.Validate(event(bad)), outbox.ErrInvalidEvent, bad)
	}
}
