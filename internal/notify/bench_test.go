package notify

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/notify/notifydb"
	"github.com/outboxref/orders/internal/notify/smtptest"
	"github.com/outboxref/orders/internal/pgtest"
)

// BenchmarkConsume measures records per second through the consumer, from
// Run to the last record's local commit, against real PostgreSQL and a
// kfake broker over TCP. Each iteration drains a fresh backlog on a fresh
// topic with a fresh group: orders x events per order, every order starting
// with order.placed, so each record is applied (projection, ledger row,
// processed_event) rather than absorbed. The group join is inside the
// timing; it is small next to the work, and smaller still in the
// 10,000-record case, the one to read a backlog's rate from. The small case keeps
// `-benchtime=1x` quick enough for CI:
//
//	go test -run '^$' -bench 'BenchmarkConsume/records=100$' -benchtime=1x ./internal/notify/
func BenchmarkConsume(b *testing.B) {
	for _, size := range benchSizes([]benchSize{{20, 5}, {200, 10}, {1000, 10}}) {
		b.Run(fmt.Sprintf("records=%d", size.orders*size.perOrder), func(b *testing.B) {
			benchmarkConsume(b, size.orders, size.perOrder, 0)
		})
	}
}

// BenchmarkConsumeOneRecordPerTx is BenchmarkConsume with one local
// transaction per record (NOTIFIER_BATCH_MAX=1), the path a failed batch
// falls back to.
func BenchmarkConsumeOneRecordPerTx(b *testing.B) {
	for _, size := range benchSizes([]benchSize{{20, 5}, {200, 10}}) {
		b.Run(fmt.Sprintf("records=%d", size.orders*size.perOrder), func(b *testing.B) {
			benchmarkConsume(b, size.orders, size.perOrder, 1)
		})
	}
}

type benchSize struct{ orders, perOrder int }

// benchSizes returns the backlog sizes to run: all of them, or with -short
// (make bench-smoke) only the smallest, which proves the benchmark works.
func benchSizes(sizes []benchSize) []benchSize {
	if testing.Short() {
		return sizes[:1]
	}
	return sizes
}

func benchmarkConsume(b *testing.B, orders, perOrder, batchMax int) {
	db := pgtest.New(b, schema.Notifier()...)
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(b, err)
	b.Cleanup(c.Close)
	broker := c.ListenAddrs()[0]
	prod, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(5*time.Millisecond))
	require.NoError(b, err)
	b.Cleanup(prod.Close)
	adm := kadm.NewClient(prod)
	quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))

	// After the placed event, cycle through types that each touch the
	// projection; most of them also write a send-ledger row.
	cycle := []string{TypePaid, TypeShipped, TypeCancelled, TypeRefundRequested}
	n := orders * perOrder
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		topic := fmt.Sprintf("bench-%d-%s", i, uuid.NewString()[:8])
		_, err := adm.CreateTopic(ctx, 6, 1, nil, topic)
		require.NoError(b, err)
		recs := make([]*kgo.Record, 0, n)
		for range orders {
			o := newOrder()
			recs = append(recs, o.record(b, o.next(TypePlaced, nil)))
			for j := 1; j < perOrder; j++ {
				recs = append(recs, o.record(b, o.next(cycle[(j-1)%len(cycle)], nil)))
			}
		}
		for _, r := range recs {
			r.Topic = topic
		}
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		require.NoError(b, prod.ProduceSync(pctx, recs...).FirstErr())
		cancel()

		proj := NewProjector(quiet)
		ib, err := inbox.New(inbox.Config{Pool: db.Pool, Apply: proj.Apply, ApplyBatch: proj.ApplyBatch, Covered: proj.Covered, Rejected: proj.Rejected,
			GapWindow: time.Minute, Registerer: prometheus.NewRegistry(), Logger: quiet})
		require.NoError(b, err)
		m, err := NewMetrics(prometheus.NewRegistry())
		require.NoError(b, err)
		var applied atomic.Int64
		all := make(chan struct{})
		cons := NewConsumer(ConsumerConfig{
			Brokers: []string{broker}, Topic: topic, Group: topic, MaxBatchRecords: batchMax,
			ExtraOpts: []kgo.Opt{kgo.FetchMaxWait(100 * time.Millisecond)},
		}, db.Pool, ib, m, quiet, func([]inbox.Event) {
			if applied.Add(1) == int64(n) {
				close(all)
			}
		})
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)

		b.StartTimer()
		go func() { done <- cons.Run(runCtx) }()
		select {
		case <-all:
		case err := <-done:
			b.Fatalf("consumer stopped early: %v", err)
		case <-time.After(5 * time.Minute):
			b.Fatalf("only %d of %d records applied", applied.Load(), n)
		}
		b.StopTimer()
		stop()
		require.NoError(b, <-done)
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkConsumeSQLOnly is the reference BenchmarkConsume is read
// against: the same records decoded and projected in memory, and the same
// rows written per record (the aggregate's version row, the processed_event
// marker, the projection, one ledger row per emailing event), but without
// Kafka, without the inbox's decisions and with the fewest round trips a
// client can manage: four set-based statements per batch of
// DefaultMaxBatchRecords records, sent together in one implicit
// transaction. The notifier's records/s divided by this one's says how
// much of the database's capacity the consumer leaves unused.
func BenchmarkConsumeSQLOnly(b *testing.B) {
	for _, size := range benchSizes([]benchSize{{20, 5}, {200, 10}, {1000, 10}}) {
		b.Run(fmt.Sprintf("records=%d", size.orders*size.perOrder), func(b *testing.B) {
			benchmarkSQLOnly(b, size.orders, size.perOrder)
		})
	}
}

func benchmarkSQLOnly(b *testing.B, orders, perOrder int) {
	db := pgtest.New(b, schema.Notifier()...)
	cycle := []string{TypePaid, TypeShipped, TypeCancelled, TypeRefundRequested}
	n := orders * perOrder
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		// Records in the order the consumer of BenchmarkConsume sees them
		// on one partition: each order's events together, in version order.
		recs := make([]*kgo.Record, 0, n)
		for range orders {
			o := newOrder()
			recs = append(recs, o.record(b, o.next(TypePlaced, nil)))
			for j := 1; j < perOrder; j++ {
				recs = append(recs, o.record(b, o.next(cycle[(j-1)%len(cycle)], nil)))
			}
		}
		b.StartTimer()
		for start := 0; start < n; start += DefaultMaxBatchRecords {
			sqlOnlyBatch(b, ctx, db.Pool, recs[start:min(start+DefaultMaxBatchRecords, n)])
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "records/s")
}

// sqlOnlyBatch decodes and projects recs in memory and writes the result
// with four statements in one round trip.
func sqlOnlyBatch(b *testing.B, ctx context.Context, pool *pgxpool.Pool, recs []*kgo.Record) {
	var (
		evIDs, evTypes, aggIDs []string
		evVersions             []int64
		aggLast                = map[string]int64{}
		state                  = map[uuid.UUID]*notifydb.ProjectionUpsertParams{}
		orderSeq               []uuid.UUID
		mails                  []*emailIntent
	)
	for _, r := range recs {
		e, err := DecodeRecord(r)
		require.NoError(b, err)
		payload, err := parsePayload(e)
		require.NoError(b, err)
		orderID := uuid.MustParse(e.AggregateID)
		var prev *notifydb.OrderProjection
		if p := state[orderID]; p != nil {
			prev = &notifydb.OrderProjection{Email: p.Email, Status: p.Status}
		} else {
			orderSeq = append(orderSeq, orderID)
		}
		next, mail := project(prev, orderID, e, payload)
		if p := state[orderID]; p != nil {
			next.Currency = cmp.Or(next.Currency, p.Currency)
			next.TotalCents = cmp.Or(next.TotalCents, p.TotalCents)
			next.RefundRequestedCents = cmp.Or(next.RefundRequestedCents, p.RefundRequestedCents)
		}
		state[orderID] = &next
		if mail != nil {
			mails = append(mails, mail)
		}
		evIDs, evTypes, aggIDs = append(evIDs, e.ID.String()), append(evTypes, e.Type), append(aggIDs, e.AggregateID)
		evVersions = append(evVersions, e.AggregateVersion)
		aggLast[e.AggregateID] = e.AggregateVersion
	}
	var lastIDs []string
	var lastVersions []int64
	for id, v := range aggLast {
		lastIDs, lastVersions = append(lastIDs, id), append(lastVersions, v)
	}
	var (
		pIDs                      []uuid.UUID
		pEmails, pStatus          []string
		pCurrency                 []*string
		pTotal, pRefund           []*int64
		pVersion                  []int64
		pEvent                    []*uuid.UUID
		mKeys, mMsgIDs, mTypes    []string
		mRecipients, mSubj, mBody []string
		mEventIDs, mOrderIDs      []uuid.UUID
		mVersions                 []int64
		mTimes                    []time.Time
	)
	for _, id := range orderSeq {
		p := state[id]
		pIDs, pEmails, pStatus = append(pIDs, id), append(pEmails, p.Email), append(pStatus, p.Status)
		pCurrency, pTotal, pRefund = append(pCurrency, p.Currency), append(pTotal, p.TotalCents), append(pRefund, p.RefundRequestedCents)
		pVersion, pEvent = append(pVersion, p.Version), append(pEvent, p.LastEventID)
	}
	for _, m := range mails {
		mKeys, mMsgIDs, mTypes = append(mKeys, OperationKey(m.EventID)), append(mMsgIDs, MessageID(m.EventID)), append(mTypes, m.EventType)
		mRecipients, mSubj, mBody = append(mRecipients, m.Recipient), append(mSubj, m.Subject), append(mBody, m.Body)
		mEventIDs, mOrderIDs = append(mEventIDs, m.EventID), append(mOrderIDs, m.OrderID)
		mVersions, mTimes = append(mVersions, m.AggregateVersion), append(mTimes, m.EventTime)
	}
	batch := &pgx.Batch{}
	batch.Queue(`INSERT INTO inbox_aggregate (aggregate_type, aggregate_id, last_version)
		SELECT 'order', u.id, u.v FROM unnest($1::text[], $2::bigint[]) AS u(id, v)
		ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_version = EXCLUDED.last_version, updated_at = clock_timestamp()
		WHERE inbox_aggregate.last_version < EXCLUDED.last_version`, lastIDs, lastVersions)
	batch.Queue(`INSERT INTO processed_event (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, outcome)
		SELECT u.id::uuid, 'order', u.agg, u.v, u.typ, 'applied' FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) AS u(id, agg, v, typ)
		ON CONFLICT (event_id) DO NOTHING`, evIDs, aggIDs, evVersions, evTypes)
	batch.Queue(`INSERT INTO order_projection (order_id, email, status, currency, total_cents, refund_requested_cents, version, last_event_id)
		SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[], $8::uuid[])
		ON CONFLICT (order_id) DO UPDATE
		SET email = EXCLUDED.email, status = EXCLUDED.status,
		    currency = coalesce(EXCLUDED.currency, order_projection.currency),
		    total_cents = coalesce(EXCLUDED.total_cents, order_projection.total_cents),
		    refund_requested_cents = coalesce(EXCLUDED.refund_requested_cents, order_projection.refund_requested_cents),
		    version = EXCLUDED.version, last_event_id = EXCLUDED.last_event_id, updated_at = clock_timestamp()
		WHERE order_projection.version < EXCLUDED.version`,
		pIDs, pEmails, pStatus, pCurrency, pTotal, pRefund, pVersion, pEvent)
	batch.Queue(`INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type, aggregate_version, event_time, recipient, subject, body)
		SELECT * FROM unnest($1::text[], $2::uuid[], $3::text[], $4::uuid[], $5::text[], $6::bigint[], $7::timestamptz[], $8::text[], $9::text[], $10::text[])
		ON CONFLICT (operation_key) DO NOTHING`,
		mKeys, mEventIDs, mMsgIDs, mOrderIDs, mTypes, mVersions, mTimes, mRecipients, mSubj, mBody)
	require.NoError(b, pool.SendBatch(ctx, batch).Close())
}

// BenchmarkSend measures emails per second through the Sender, from a
// ledger of pending rows to an in-process SMTP server over TCP: per email,
// its claim (a transaction of its own), the SMTP transaction on a kept
// connection, and the fenced result update; with one worker and with
// EMAIL_SENDERS' default.
func BenchmarkSend(b *testing.B) {
	for _, workers := range []int{1, 4, 8} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) { benchmarkSend(b, workers) })
	}
}

func benchmarkSend(b *testing.B, workers int) {
	srv := smtptest.Start(b)
	mailer := &SMTPMailer{Addr: srv.Addr, HeloName: "notifier.test", Timeout: 5 * time.Second, TLS: TLSNone, MaxIdle: workers}
	b.Cleanup(func() { _ = mailer.Close() })
	benchmarkSender(b, workers, mailer)
	require.Equal(b, b.N*sendBenchEmails(), len(srv.Accepted()), "every email sent once")
}

// sendBenchEmails is how many emails each iteration of the send benchmarks
// sends: 1,000, or 100 with -short (make bench-smoke), where one worker
// waiting for a loaded disk could otherwise take half a minute.
func sendBenchEmails() int {
	if testing.Short() {
		return 100
	}
	return 1000
}

// BenchmarkSendLedgerOnly is BenchmarkSend/workers=1 with a mailer that
// accepts every message without any I/O: what is left is the ledger, one
// claim per email whose commit waits for the WAL flush. It is the ceiling
// the database puts on one worker, to read next to BenchmarkSendSMTPOnly,
// the SMTP server's.
//
// With more workers it shows how far they share the WAL flushes: each
// worker still waits for one flush per email, and concurrent commits
// wait for the same flush.
func BenchmarkSendLedgerOnly(b *testing.B) {
	for _, workers := range []int{1, 8} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) { benchmarkSender(b, workers, acceptAll{}) })
	}
}

// acceptAll is a Mailer that accepts every message at once.
type acceptAll struct{}

func (acceptAll) Send(context.Context, string, string, []byte) (string, error) { return "250 OK", nil }

// benchmarkSender sends sendBenchEmails pending emails per iteration
// through a Sender with workers and mailer, and reports emails/s.
func benchmarkSender(b *testing.B, workers int, mailer Mailer) {
	n := sendBenchEmails()
	db := pgtest.New(b, schema.Notifier()...)
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(b, err)
	quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))
	s := NewSender(db.Pool, mailer, SenderConfig{From: "orders@shop.test", PollInterval: time.Hour, SendingTimeout: time.Minute,
		Workers: workers}, m, quiet)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		_, err := db.Pool.Exec(ctx, `INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
				aggregate_version, event_time, recipient, subject, body)
			SELECT id::text, id, '<' || id::text || '>', gen_random_uuid(), 'order.placed', 1, clock_timestamp(),
				'alice@example.com', 'Order received', 'Hello,' || chr(10) || 'thank you for your order.'
			FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, $1)) g`, n)
		require.NoError(b, err)
		b.StartTimer()
		sent, err := s.RunOnce(ctx)
		require.NoError(b, err)
		require.Equal(b, n, sent)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "emails/s")
}

// BenchmarkSendSMTPOnly is the reference BenchmarkSend/workers=1 is read
// against: the same messages to the same in-process SMTP server, sent by a
// bare loop on one kept connection (MAIL, RCPT, DATA per message), without
// the ledger. BenchmarkSend's emails/s divided by this one's says what the
// ledger's claim and result cost next to the SMTP transaction itself.
//
//	go test -run '^$' -bench 'BenchmarkSend(SMTPOnly)?$' -benchtime=3x ./internal/notify/
func BenchmarkSendSMTPOnly(b *testing.B) {
	n := sendBenchEmails()
	srv := smtptest.Start(b)
	c, err := smtp.Dial(srv.Addr)
	require.NoError(b, err)
	b.Cleanup(func() { _ = c.Close() })
	require.NoError(b, c.Hello("notifier.test"))
	msgs := make([][]byte, n)
	for i := range msgs {
		id := uuid.New()
		msgs[i] = buildMessage("orders@shop.test", notifydb.EmailSend{
			OperationKey: id.String(), EventID: id, MessageID: "<" + id.String() + ">", OrderID: uuid.New(),
			EventType: "order.placed", Recipient: "alice@example.com", Subject: "Order received",
			Body: "Hello,\nthank you for your order.",
		})
	}
	b.ResetTimer()
	for range b.N {
		for _, msg := range msgs {
			require.NoError(b, c.Mail("orders@shop.test", nil))
			require.NoError(b, c.Rcpt("alice@example.com", nil))
			w, err := c.Data()
			require.NoError(b, err)
			_, err = w.Write(msg)
			require.NoError(b, err)
			require.NoError(b, w.Close())
		}
	}
	b.StopTimer()
	require.Equal(b, b.N*n, len(srv.Accepted()), "every email accepted once")
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "emails/s")
}

// BenchmarkSendBacklog drains a backlog of n emails and then one of 10n,
// each on a fresh ledger whose statistics were taken while it was empty
// (and stay so: autovacuum is off for it), as after an outage. Each email
// is claimed, sent to the in-process SMTP server and recorded by 4
// workers. It reports the time per email of each size and their ratio:
// about 1 when a claim costs the same however long the backlog, about 10
// when each claim reads the whole backlog. -short (make bench-smoke) runs
// 100 and 1,000 emails, in a few seconds; the full run 3,000 and 30,000:
//
//	go test -run '^$' -bench BenchmarkSendBacklog -benchtime=1x ./internal/notify/
func BenchmarkSendBacklog(b *testing.B) {
	n := 3_000
	if testing.Short() {
		n = 100
	}
	var small, large time.Duration
	for range b.N {
		small += sendBacklog(b, n)
		large += sendBacklog(b, 10*n)
	}
	perSmall := small / time.Duration(b.N*n)
	perLarge := large / time.Duration(b.N*10*n)
	b.ReportMetric(float64(perSmall.Microseconds()), fmt.Sprintf("µs/email@%d", n))
	b.ReportMetric(float64(perLarge.Microseconds()), fmt.Sprintf("µs/email@%d", 10*n))
	b.ReportMetric(float64(large)/float64(small), "time-ratio-10x")
}

// sendBacklog sends n emails from a fresh ledger and returns the time the
// sender took, with the benchmark's timer running only meanwhile.
func sendBacklog(b *testing.B, n int) time.Duration {
	b.StopTimer()
	const workers = 4
	db := pgtest.New(b, schema.Notifier()...)
	pgtest.FreezeStats(b, db.Pool, "email_send")
	srv := smtptest.Start(b)
	mailer := &SMTPMailer{Addr: srv.Addr, HeloName: "notifier.test", Timeout: 5 * time.Second, TLS: TLSNone, MaxIdle: workers}
	defer func() { _ = mailer.Close() }()
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(b, err)
	s := NewSender(db.Pool, mailer, SenderConfig{From: "orders@shop.test", PollInterval: time.Hour, SendingTimeout: time.Minute,
		Workers: workers}, m, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	ctx := context.Background()
	_, err = db.Pool.Exec(ctx, `INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
			aggregate_version, event_time, recipient, subject, body)
		SELECT id::text, id, '<' || id::text || '>', gen_random_uuid(), 'order.placed', 1, clock_timestamp(),
			'alice@example.com', 'Order received', 'Hello,' || chr(10) || 'thank you for your order.'
		FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, $1)) g`, n)
	require.NoError(b, err)
	start := time.Now()
	b.StartTimer()
	sent, err := s.RunOnce(ctx)
	b.StopTimer()
	took := time.Since(start)
	require.NoError(b, err)
	require.Equal(b, n, sent)
	require.Len(b, srv.Accepted(), n, "every email sent once")
	return took
}
