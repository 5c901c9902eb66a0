package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// smtpSink is an SMTP server that accepts every message and keeps only a
// count: the notifier's emails go somewhere fast and local.
type smtpSink struct {
	srv    *smtp.Server
	addr   string
	n      atomic.Int64
	lastAt atomic.Int64 // Unix nanoseconds of the last message accepted
}

func startSMTPSink() (*smtpSink, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &smtpSink{addr: l.Addr().String()}
	s.srv = smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return sinkSession{s}, nil }))
	s.srv.Domain = "bench.local"
	s.srv.ReadTimeout = time.Minute
	s.srv.WriteTimeout = time.Minute
	go func() { _ = s.srv.Serve(l) }()
	return s, nil
}

func (s *smtpSink) Close() { _ = s.srv.Close() }

type sinkSession struct{ s *smtpSink }

func (sinkSession) Reset()                               {}
func (sinkSession) Logout() error                        { return nil }
func (sinkSession) Mail(string, *smtp.MailOptions) error { return nil }
func (sinkSession) Rcpt(string, *smtp.RcptOptions) error { return nil }
func (ss sinkSession) Data(r io.Reader) error {
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err
	}
	ss.s.n.Add(1)
	ss.s.lastAt.Store(time.Now().UnixNano())
	return nil
}

// sendRate counts the messages the sink accepts over w and returns them
// per second. When the sender ran out of emails during w (the sink was
// idle at its end for longer than the sender's pauses between emails),
// the rate counts only up to the last message.
func (s *smtpSink) sendRate(ctx context.Context, w time.Duration) (float64, int64) {
	n0, t0 := s.n.Load(), time.Now()
	select {
	case <-ctx.Done():
	case <-time.After(w):
	}
	n1, t1 := s.n.Load(), time.Now()
	if last := time.Unix(0, s.lastAt.Load()); t1.Sub(last) > 200*time.Millisecond && last.After(t0) {
		t1 = last
	}
	return float64(n1-n0) / t1.Sub(t0).Seconds(), n1 - n0
}

// benchMessage is an email of the size and shape the notifier sends.
func benchMessage(i int) []byte {
	id := uuid.New()
	return []byte(fmt.Sprintf("From: orders@bench.local\r\nTo: customer-%d@example.com\r\nSubject: Your order %s\r\nDate: %s\r\n"+
		"Message-ID: <%s@bench.local>\r\nX-Event-ID: %s\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n"+
		"Content-Transfer-Encoding: quoted-printable\r\n\r\nHello,\r\n\r\nwe received your order %s. Total: 25.00 EUR.\r\n",
		i%1000, id, time.Now().UTC().Format(time.RFC1123Z), id, id, id))
}

// smtpLoop sends emails to addr on one connection, one after another, for
// w and returns the rate the server accepted them at: the reference of the
// notifier's sender.
func smtpLoop(ctx context.Context, addr string, w time.Duration) (float64, error) {
	c, err := smtp.Dial(addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if err := c.Hello("bench.local"); err != nil {
		return 0, err
	}
	start := time.Now()
	n := 0
	for time.Since(start) < w && ctx.Err() == nil {
		if err := c.SendMail("orders@bench.local", []string{fmt.Sprintf("customer-%d@example.com", n%1000)}, bytes.NewReader(benchMessage(n))); err != nil {
			return 0, fmt.Errorf("smtp loop: %w", err)
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds(), c.Quit()
}

// notifierServe starts `notifier serve` reading the topic from the start.
func (b *bench) notifierServe(ctx context.Context, db, broker, smtpAddr, ordersBase string) (*proc, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	env := map[string]string{
		"DATABASE_URL":       b.dbURL(db),
		"HTTP_ADDR":          addr,
		"KAFKA_BROKERS":      broker,
		"ORDERS_TOPIC":       topic,
		"KAFKA_GROUP":        "bench-notifier-" + b.runID,
		"KAFKA_START_OFFSET": "earliest",
		"SMTP_ADDR":          smtpAddr,
		"ORDERS_API_URL":     ordersBase,
		"ORDERS_API_TOKEN":   notifierToken,
	}
	if b.opts.Senders > 0 {
		env["EMAIL_SENDERS"] = strconv.Itoa(b.opts.Senders)
	}
	p, err := b.start("notifier serve", b.bins["notifier"], env, "serve")
	if err != nil {
		return nil, err
	}
	return p, p.waitHTTP(ctx, "http://"+addr+"/readyz")
}

// countProcessed counts the notifier's inbox markers by outcome.
func countProcessed(ctx context.Context, pool *pgxpool.Pool) (total, applied int64, err error) {
	err = pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE outcome = 'applied') FROM processed_event").Scan(&total, &applied)
	return total, applied, err
}

// notifierScenario puts a backlog of order events on the topic (the relay
// publishes a filled outbox), then times a fresh notifier consuming it
// against a SQL loop doing the notifier's writes for the same events.
func (b *bench) notifierScenario(ctx context.Context) error {
	const sc = "notifier"
	n := b.opts.NotifierBacklog / 2 * 2
	odb, err := b.ordersDB(ctx, "notifier_orders")
	if err != nil {
		return err
	}
	if err := b.fillBacklog(ctx, odb, n); err != nil {
		return err
	}
	broker, baddr, err := b.startBroker(ctx)
	if err != nil {
		return err
	}
	opool, err := b.pool(ctx, odb)
	if err != nil {
		return err
	}
	defer opool.Close()
	env, metrics, err := b.relayEnv(odb, baddr, b.opts.RelayBatch)
	if err != nil {
		return err
	}
	relay, err := b.start("orders relay", b.bins["orders"], env, "relay")
	if err != nil {
		return err
	}
	if err := relay.waitHTTP(ctx, "http://"+metrics+"/readyz"); err != nil {
		return err
	}
	if _, err := drainTime(ctx, opool, time.Now(), b.opts.DrainTimeout, []*proc{relay, broker}); err != nil {
		return fmt.Errorf("publishing the backlog: %w", err)
	}
	if err := b.stopProc(sc, relay); err != nil {
		return err
	}
	if err := checkDelivered(ctx, opool, n); err != nil {
		return err
	}
	b.logf("%d events on the topic", n)

	sink, err := startSMTPSink()
	if err != nil {
		return err
	}
	defer sink.Close()
	ndb, err := b.notifierDB(ctx, "notifier")
	if err != nil {
		return err
	}
	npool, err := b.pool(ctx, ndb)
	if err != nil {
		return err
	}
	defer npool.Close()
	start := time.Now()
	// Nothing serves the orders API here: with no gaps the notifier never
	// calls it.
	notifier, err := b.notifierServe(ctx, ndb, baddr, sink.addr, "http://127.0.0.1:9")
	if err != nil {
		return err
	}
	// Who kept the cores busy while the backlog was applied: the reference
	// below runs alone, the notifier beside its broker, its sender and the
	// SMTP server.
	meter := startCPU(map[string]int{"notifier serve": notifier.pid(), "devbroker": broker.pid(), "bench (SMTP sink)": selfPID()}, b.runID)
	err = waitFor(ctx, b.opts.DrainTimeout, 250*time.Millisecond, []*proc{notifier, broker}, func(ctx context.Context) (bool, error) {
		total, _, err := countProcessed(ctx, npool)
		return total >= int64(n), err
	})
	if err != nil {
		return fmt.Errorf("notifier consuming the backlog: %w", err)
	}
	// Throughput from the first record received to the last applied: the
	// process start and the consumer group's join are not part of it.
	var first, last time.Time
	if err := npool.QueryRow(ctx, "SELECT min(received_at), max(processed_at) FROM processed_event").Scan(&first, &last); err != nil {
		return err
	}
	total, applied, err := countProcessed(ctx, npool)
	if err != nil {
		return err
	}
	if applied != int64(n) {
		return fmt.Errorf("notifier: %d events processed, %d applied, want %d applied", total, applied, n)
	}
	applyCPU := meter.stop()
	took := last.Sub(first)
	sentDuring := sink.n.Load()
	b.logf("notifier serve: first record received %s after the start", first.Sub(start).Round(time.Millisecond))
	rate := float64(n) / took.Seconds()
	b.logf("notifier serve: %d events applied in %s (%d emails received so far)", n, took.Round(time.Millisecond), sentDuring)
	// The sender, with a ledger full of emails: what the sink accepts over
	// a window, against a loop on one connection to the same sink.
	window := 10 * time.Second
	if b.opts.Tiny {
		window = 2 * time.Second
	}
	sendRate, sent := sink.sendRate(ctx, window)
	b.logf("notifier sender: %d emails in %s", sent, window)
	if err := b.stopProc(sc, notifier); err != nil {
		return err
	}
	loopRate, err := smtpLoop(ctx, sink.addr, window)
	if err != nil {
		return err
	}
	b.logf("SMTP loop on one connection: %.0f emails/s", loopRate)
	if err := b.stopProc(sc, broker); err != nil {
		return err
	}

	rdb, err := b.notifierDB(ctx, "notifier_ref")
	if err != nil {
		return err
	}
	rpool, err := b.pool(ctx, rdb)
	if err != nil {
		return err
	}
	defer rpool.Close()
	events, err := loadEvents(ctx, opool)
	if err != nil {
		return err
	}
	refTook, err := notifierSQLLoop(ctx, rpool, events, notifierBatch)
	if err != nil {
		return err
	}
	refRate := float64(len(events)) / refTook.Seconds()
	b.logf("notifier SQL loop: %d events in %s", len(events), refTook.Round(time.Millisecond))
	pdb, err := b.notifierDB(ctx, "notifier_pipe")
	if err != nil {
		return err
	}
	ppool, err := b.pool(ctx, pdb)
	if err != nil {
		return err
	}
	defer ppool.Close()
	pipeMeter := startCPU(map[string]int{"bench (SQL client)": selfPID()}, b.runID)
	pipeTook, err := notifierPipelined(ctx, ppool, events, notifierBatch)
	pipeCPU := pipeMeter.stop()
	if err != nil {
		return err
	}
	pipeRate := float64(len(events)) / pipeTook.Seconds()
	b.logf("notifier SQL pipeline: %d events in %s", len(events), pipeTook.Round(time.Millisecond))
	b.rep.add(result{Scenario: sc, Figure: fmt.Sprintf("notifier apply, %d records", n), Value: rate, Unit: "records/s",
		Reference: "notifier SQL loop", RefValue: refRate, Target: ">= 10,000 records/s",
		Note: fmt.Sprintf("notifier: `notifier serve` on a fresh database with KAFKA_START_OFFSET=earliest, from the first received_at to the last processed_at of its inbox; SQL loop: per record the inbox marker, the aggregate version row (ensure, lock, advance), the projection (read, upsert) and the email row, %d records per transaction, one connection", notifierBatch)})
	b.rep.add(result{Scenario: sc, Figure: "notifier sender", Value: sendRate, Unit: "emails/s",
		Reference: "SMTP loop, one connection", RefValue: loopRate, Target: "ratio >= 0.8",
		Note: fmt.Sprintf("sender: emails the benchmark's SMTP sink accepted from `notifier serve` (%s) over %s once the backlog was applied, the ledger still full; loop: the benchmark sending emails of the same shape to the same sink, one after another on one connection, for as long", b.sendersNote(), window)})
	b.rep.add(result{Scenario: sc, Figure: "notifier apply / SQL pipeline", Value: rate, Unit: "records/s",
		Reference: "notifier SQL pipeline", RefValue: pipeRate, Target: "ratio >= 0.9",
		Note: fmt.Sprintf("SQL pipeline: the same statements, each transaction's sent as one pipelined batch (no round trip per statement); while the notifier applied the backlog its sender also sent %d emails", sentDuring)})
	// The CPU one record cost the whole machine, applied by the notifier
	// and by the bare pipeline: with both cores busy, what the notifier's
	// process, its broker and its sender spend is what the database does
	// not get.
	applyMS, _ := applyCPU.perEvent(rate)
	pipeMS, _ := pipeCPU.perEvent(pipeRate)
	b.rep.add(result{Scenario: sc, Figure: "CPU per record, notifier apply", Value: applyMS, Unit: "ms",
		Reference: "SQL pipeline", RefValue: pipeMS, Target: "-",
		Note: "the whole machine's busy cores over the apply, divided by the records per second; notifier: " + applyCPU.String() + "; pipeline: " + pipeCPU.String()})
	b.addCores(sc, "notifier apply: ", applyCPU)
	b.addCores(sc, "SQL pipeline: ", pipeCPU)
	return nil
}

// notifierBatch is the notifier's default NOTIFIER_BATCH_MAX.
const notifierBatch = 200

// event is one order event as the notifier receives it.
type event struct {
	ID        uuid.UUID
	OrderID   string
	Version   int64
	Type      string
	Payload   map[string]any
	CreatedAt time.Time
}

func loadEvents(ctx context.Context, pool *pgxpool.Pool) ([]event, error) {
	rows, err := pool.Query(ctx, `SELECT event_id, aggregate_id, aggregate_version, event_type, payload, created_at
		FROM outbox ORDER BY created_at, aggregate_version`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (event, error) {
		var e event
		err := r.Scan(&e.ID, &e.OrderID, &e.Version, &e.Type, &e.Payload, &e.CreatedAt)
		return e, err
	})
}

// notifierSQLLoop writes, for each event, what the notifier writes when it
// applies an order event in order, batch events per transaction.
func notifierSQLLoop(ctx context.Context, pool *pgxpool.Pool, events []event, batch int) (time.Duration, error) {
	return inTransactions(ctx, pool, events, batch, func(tx pgx.Tx, chunk []event) error {
		for _, e := range chunk {
			if err := applyOne(ctx, tx, e); err != nil {
				return fmt.Errorf("event %s: %w", e.ID, err)
			}
		}
		return nil
	})
}

// notifierPipelined writes the same rows as notifierSQLLoop, but sends
// each transaction's statements in one pipeline: the database's share of
// the work without the round trips.
func notifierPipelined(ctx context.Context, pool *pgxpool.Pool, events []event, batch int) (time.Duration, error) {
	return inTransactions(ctx, pool, events, batch, func(tx pgx.Tx, chunk []event) error {
		var bt pgx.Batch
		for _, e := range chunk {
			for _, st := range applyStatements(e) {
				bt.Queue(st[0].(string), st[1:]...)
			}
		}
		return tx.SendBatch(ctx, &bt).Close()
	})
}

// inTransactions runs apply over events in transactions of batch events
// each, on one connection, and returns the time it all took.
func inTransactions(ctx context.Context, pool *pgxpool.Pool, events []event, batch int, apply func(pgx.Tx, []event) error) (time.Duration, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	start := time.Now()
	for lo := 0; lo < len(events); lo += batch {
		chunk := events[lo:min(lo+batch, len(events))]
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return apply(tx, chunk) }); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// applyStatements returns the statements the notifier runs to apply one
// order event in order, with their arguments.
func applyStatements(e event) [][]any {
	email, _ := e.Payload["email"].(string)
	status := "placed"
	if e.Type == "order.paid" {
		status = "paid"
	}
	// The ledger's Message-ID is its key in angle brackets, as the
	// notifier writes it (a check in the schema holds every row to it).
	key := e.Type + ":" + e.ID.String()
	return [][]any{
		{`INSERT INTO processed_event (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, outcome)
		VALUES ($1, 'order', $2, $3, $4, 'applied') ON CONFLICT (event_id) DO NOTHING RETURNING event_id`,
			e.ID, e.OrderID, e.Version, e.Type},
		{`INSERT INTO inbox_aggregate (aggregate_type, aggregate_id) VALUES ('order', $1)
		ON CONFLICT (aggregate_type, aggregate_id) DO NOTHING`, e.OrderID},
		{`SELECT last_version FROM inbox_aggregate
		WHERE aggregate_type = 'order' AND aggregate_id = $1 FOR UPDATE`, e.OrderID},
		{`UPDATE inbox_aggregate SET last_version = $2, updated_at = clock_timestamp()
		WHERE aggregate_type = 'order' AND aggregate_id = $1 AND last_version < $2`, e.OrderID, e.Version},
		{`SELECT * FROM order_projection WHERE order_id = $1`, e.OrderID},
		{`INSERT INTO order_projection (order_id, email, status, currency, total_cents, version, last_event_id)
		VALUES ($1, $2, $3, 'EUR', 2500, $4, $5)
		ON CONFLICT (order_id) DO UPDATE
		SET email = EXCLUDED.email, status = EXCLUDED.status,
		    currency = coalesce(EXCLUDED.currency, order_projection.currency),
		    total_cents = coalesce(EXCLUDED.total_cents, order_projection.total_cents),
		    version = EXCLUDED.version, last_event_id = EXCLUDED.last_event_id, updated_at = clock_timestamp()
		WHERE order_projection.version < EXCLUDED.version`, e.OrderID, email, status, e.Version, e.ID},
		{`INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
			aggregate_version, event_time, recipient, subject, body, state)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending')
		ON CONFLICT (operation_key) DO NOTHING RETURNING operation_key`,
			key, e.ID, "<" + key + ">", e.OrderID, e.Type, e.Version,
			e.CreatedAt, email, "Your order " + e.OrderID, "Order " + e.OrderID + ": " + status + "."},
	}
}

// applyOne runs the statements of one event one round trip each.
func applyOne(ctx context.Context, tx pgx.Tx, e event) error {
	for _, st := range applyStatements(e) {
		rows, err := tx.Query(ctx, st[0].(string), st[1:]...)
		if err != nil {
			return err
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	return nil
}

// sendersNote names the notifier's EMAIL_SENDERS in a result's note.
func (b *bench) sendersNote() string {
	if b.opts.Senders > 0 {
		return fmt.Sprintf("EMAIL_SENDERS=%d", b.opts.Senders)
	}
	return "EMAIL_SENDERS default"
}
