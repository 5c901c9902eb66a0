package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/migrate"
	"github.com/outboxref/orders/internal/notify"
	"github.com/outboxref/orders/internal/notify/smtptest"
	"github.com/outboxref/orders/internal/pgtest"
	"github.com/outboxref/orders/internal/testlog"
)

func envFrom(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// TestRetentionRefused is C5: a processed_event TTL shorter than the
// broker's redelivery window plus the backup retention is refused at
// start-up, before anything connects.
func TestRetentionRefused(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(context.Background(), []string{"serve"}, envFrom(map[string]string{
		"ORDERS_API_TOKEN":         "svc",
		"PROCESSED_EVENT_TTL":      "72h",
		"BROKER_REDELIVERY_WINDOW": "48h",
		"BACKUP_RETENTION":         "48h",
		"DATABASE_URL":             "postgres://nobody@127.0.0.1:1/none",
	}), &out)
	require.Error(t, err)
	require.Contains(t, err.Error(), "PROCESSED_EVENT_TTL=72h0m0s is shorter than BROKER_REDELIVERY_WINDOW (48h0m0s) + BACKUP_RETENTION (48h0m0s)")
	require.Empty(t, out.String(), "nothing started")
}

func TestConfig(t *testing.T) {
	t.Parallel()

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		c, err := loadConfig(envFrom(map[string]string{"ORDERS_API_TOKEN": "secret-token"}))
		require.NoError(t, err)
		require.Equal(t, "notifier", c.Kafka.Group)
		require.Equal(t, "orders.events", c.Kafka.Topic)
		require.Equal(t, ":8081", c.HTTPAddr)
		require.Equal(t, notify.PolicyHold, c.Email.UnknownPolicy)
		require.Equal(t, notify.DefaultMaxBatchRecords, c.Kafka.BatchMax)
		require.Equal(t, notify.TLSNone, c.Email.TLS, "the local demo sink speaks plain SMTP")
		require.Empty(t, c.Email.Username)
		var out bytes.Buffer
		c.print(&out)
		require.Contains(t, out.String(), "NOTIFIER_BATCH_MAX=200")
		require.Contains(t, out.String(), "SMTP_TLS=none")
		require.NotContains(t, out.String(), "secret-token")
		require.Contains(t, out.String(), "ORDERS_API_TOKEN=xxxxx")
	})

	t.Run("AllProblemsAtOnce", func(t *testing.T) {
		t.Parallel()
		_, err := loadConfig(envFrom(map[string]string{
			"EMAIL_UNKNOWN_POLICY":  "retry",
			"SMTP_TIMEOUT":          "1m",
			"EMAIL_SENDING_TIMEOUT": "1m",
			"KAFKA_SASL_MECHANISM":  "PLAIN",
			"GAP_WINDOW":            "soon",
			"NOTIFIER_BATCH_MAX":    "0",
		}))
		require.Error(t, err)
		for _, want := range []string{"ORDERS_API_TOKEN is required", "EMAIL_UNKNOWN_POLICY=\"retry\"",
			"EMAIL_SENDING_TIMEOUT", "GAP_WINDOW", "SASL", "NOTIFIER_BATCH_MAX=\"0\": want an integer from 1 to 2000"} {
			require.Contains(t, err.Error(), want)
		}
	})
}

// TestSMTPConfig: credentials go over TLS only, and the password is never
// printed.
func TestSMTPConfig(t *testing.T) {
	t.Parallel()
	base := func(kv ...string) func(string) string {
		m := map[string]string{"ORDERS_API_TOKEN": "svc"}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return envFrom(m)
	}

	t.Run("AuthWithoutTLSRefused", func(t *testing.T) {
		t.Parallel()
		var out bytes.Buffer
		err := run(context.Background(), []string{"serve"}, base("SMTP_USERNAME", "notifier", "SMTP_PASSWORD", "smtp-s3cret",
			"DATABASE_URL", "postgres://nobody@127.0.0.1:1/none"), &out)
		require.Error(t, err)
		require.Contains(t, err.Error(), "SMTP_TLS=starttls or SMTP_TLS=tls")
		require.NotContains(t, err.Error(), "smtp-s3cret")
		require.Empty(t, out.String(), "nothing started")
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name string
			env  []string
			want string
		}{
			{"UsernameWithoutPassword", []string{"SMTP_TLS", "starttls", "SMTP_USERNAME", "notifier"}, "SMTP_USERNAME and SMTP_PASSWORD go together"},
			{"PasswordWithoutUsername", []string{"SMTP_TLS", "tls", "SMTP_PASSWORD", "smtp-s3cret"}, "SMTP_USERNAME and SMTP_PASSWORD go together"},
			{"UnknownTLSMode", []string{"SMTP_TLS", "ssl"}, `SMTP_TLS="ssl": want none, starttls or tls`},
			{"CAFileWithoutTLS", []string{"SMTP_TLS_CA_FILE", "/etc/ssl/ca.pem"}, "SMTP_TLS_CA_FILE and SMTP_TLS_SERVER_NAME need SMTP_TLS"},
			{"MissingCAFile", []string{"SMTP_TLS", "starttls", "SMTP_TLS_CA_FILE", "/nonexistent/ca.pem"}, "SMTP_TLS_CA_FILE: read CA file"},
			{"NoHostToVerify", []string{"SMTP_TLS", "tls", "SMTP_ADDR", ":465"}, "set SMTP_TLS_SERVER_NAME"},
			{"AddrWithoutPort", []string{"SMTP_ADDR", "smtp.example.com"}, `SMTP_ADDR="smtp.example.com": want host:port`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				_, err := loadConfig(base(tc.env...))
				require.Error(t, err)
				require.Contains(t, err.Error(), tc.want)
				require.NotContains(t, err.Error(), "smtp-s3cret")
			})
		}
	})

	t.Run("PasswordMasked", func(t *testing.T) {
		t.Parallel()
		c, err := loadConfig(base("SMTP_TLS", "STARTTLS", "SMTP_ADDR", "smtp.example.com:587",
			"SMTP_USERNAME", "notifier", "SMTP_PASSWORD", "smtp-s3cret"))
		require.NoError(t, err)
		require.Equal(t, notify.TLSStartTLS, c.Email.TLS)
		var out bytes.Buffer
		c.print(&out)
		require.Contains(t, out.String(), "SMTP_TLS=starttls")
		require.Contains(t, out.String(), "SMTP_USERNAME=notifier SMTP_PASSWORD=xxxxx")
		require.NotContains(t, out.String(), "smtp-s3cret")
	})

	// FromEnvironment: the settings reach a relay that requires STARTTLS
	// and AUTH, trusting only the CA in SMTP_TLS_CA_FILE.
	t.Run("FromEnvironment", func(t *testing.T) {
		t.Parallel()
		srv := smtptest.StartWith(t, smtptest.Options{TLS: smtptest.StartTLS, Username: "notifier", Password: "smtp-s3cret"})
		c, err := loadConfig(base("SMTP_ADDR", srv.Addr, "SMTP_TLS", "starttls", "SMTP_TLS_CA_FILE", srv.WriteCAFile(t),
			"SMTP_USERNAME", "notifier", "SMTP_PASSWORD", "smtp-s3cret"))
		require.NoError(t, err)
		m, err := c.Email.mailer()
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.Close() })
		_, err = m.Send(context.Background(), c.Email.From, "alice@example.com", []byte("Subject: hello\r\n\r\nhello\r\n"))
		require.NoError(t, err)
		got := srv.Accepted()
		require.Len(t, got, 1)
		require.True(t, got[0].TLS)
		require.Equal(t, "PLAIN", got[0].AuthMechanism)
	})
}

// TestMigrate: migrate creates the database when it is missing and is
// idempotent.
func TestMigrate(t *testing.T) {
	t.Parallel()
	url := pgtest.Scratch(t, "notifier_cmd")
	env := envFrom(map[string]string{"DATABASE_URL": url})
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"migrate"}, env, &out))
	require.Contains(t, out.String(), "migrate: applied inbox/00001_inbox.sql")
	require.Contains(t, out.String(), "migrate: applied notifier/00001_notify.sql")
	out.Reset()
	require.NoError(t, run(context.Background(), []string{"migrate"}, env, &out))
	require.Contains(t, out.String(), "migrate: 0 applied", "second run applies nothing")
	out.Reset()
	require.NoError(t, run(context.Background(), []string{"migrate", "status"}, env, &out))
	require.Regexp(t, `inbox\s+1\s+00001_inbox.sql\s+applied`, out.String())
	require.Regexp(t, `notifier\s+1\s+00001_notify.sql\s+applied`, out.String())
}

// TestServe runs the binary's serve command end to end: it migrates its
// database, consumes an order's events from a Kafka cluster over TCP and
// delivers exactly three emails to an SMTP server (placed, paid, cancelled;
// the refund request sends none). Re-producing every record sends nothing
// new and raises inbox_duplicates_total by the number of records. A
// cancelled context shuts it down cleanly. `notifier healthcheck`, the
// container's probe, fails before the server listens and passes once it is
// ready.
func TestServe(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Scratch(t, "notifier_cmd")
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(6, "orders.events"))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	broker := cluster.ListenAddrs()[0]
	mail := smtptest.Start(t)
	api := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(api.Close)
	httpAddr := freeAddr(t)

	env := envFrom(map[string]string{
		"DATABASE_URL":          dbURL,
		"KAFKA_BROKERS":         broker,
		"KAFKA_INSTANCE_ID":     "notifier-test",
		"KAFKA_SESSION_TIMEOUT": "6s",
		"SMTP_ADDR":             mail.Addr,
		"SMTP_TIMEOUT":          "5s",
		"EMAIL_POLL_INTERVAL":   "50ms",
		"HTTP_ADDR":             httpAddr,
		"ORDERS_API_URL":        api.URL,
		"ORDERS_API_TOKEN":      "svc-secret",
	})
	require.NoError(t, run(context.Background(), []string{"migrate"}, env, io.Discard))
	// The container health check runs `notifier healthcheck` beside the
	// server: it fails while nothing serves HTTP_ADDR.
	require.Error(t, run(context.Background(), []string{"healthcheck"}, env, io.Discard))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &testlog.Buffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, env, out) }()
	base := "http://" + httpAddr
	require.Eventually(t, func() bool { return get(base+"/readyz") == http.StatusOK }, 20*time.Second, 50*time.Millisecond)
	require.Equal(t, http.StatusOK, get(base+"/healthz"))
	require.NoError(t, run(context.Background(), []string{"healthcheck"}, env, io.Discard))

	prod, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.DefaultProduceTopic("orders.events"))
	require.NoError(t, err)
	defer prod.Close()
	orderID := uuid.New()
	recs := orderRecords(t, orderID)
	require.NoError(t, prod.ProduceSync(ctx, recs...).FirstErr())

	require.Eventually(t, func() bool { return len(mail.Accepted()) == 3 }, 20*time.Second, 50*time.Millisecond)
	var subjects []string
	for i, m := range mail.Accepted() {
		subjects = append(subjects, m.Subject)
		require.Equal(t, notify.MessageID(uuid.MustParse(string(header(recs[i], "ce_id")))), m.MessageID)
		require.Equal(t, []string{"alice@example.com"}, m.To)
	}
	short := orderID.String()[:8]
	require.Equal(t, []string{"Order " + short + " received", "Payment received for order " + short, "Order " + short + " cancelled"}, subjects)

	before := metricSum(t, base, "inbox_duplicates_total")
	for _, r := range recs {
		r.Partition, r.Offset = 0, 0
	}
	require.NoError(t, prod.ProduceSync(ctx, recs...).FirstErr())
	require.Eventually(t, func() bool { return metricSum(t, base, "inbox_duplicates_total") == before+4 }, 20*time.Second, 50*time.Millisecond)
	// A sync point instead of reading the mailbox at once: the order's next
	// event (same key, so consumed after the copies) has been emailed, so
	// any email the copies caused has been sent too.
	shipped := orderRecord(t, orderID, 5, "order.shipped", map[string]any{"email": "alice@example.com", "shipped_at": time.Now().UTC().Format(time.RFC3339)})
	require.NoError(t, prod.ProduceSync(ctx, shipped).FirstErr())
	require.Eventually(t, func() bool {
		return mail.Count(notify.MessageID(uuid.MustParse(string(header(shipped, "ce_id"))))) == 1
	}, 20*time.Second, 50*time.Millisecond)
	require.Len(t, mail.Received(), 4, "no new email for re-produced records")
	for _, r := range recs[:3] {
		require.Equal(t, 1, mail.Count(notify.MessageID(uuid.MustParse(string(header(r, "ce_id"))))))
	}
	require.Equal(t, 4.0, metricSum(t, base, `notifier_emails_total{result="sent"}`))

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
	logs := out.String()
	require.Contains(t, logs, `"msg":"notifier stopped"`)
	require.NotContains(t, logs, "svc-secret", "the token is never printed")
	require.NotContains(t, logs, "BOOK-1", "payloads are never logged")
	require.Contains(t, logs, `"aggregate_version":3`)
}

func orderRecords(t *testing.T, id uuid.UUID) []*kgo.Record {
	t.Helper()
	now := time.Now().UTC().Format(time.RFC3339Nano)
	events := []struct {
		typ     string
		payload map[string]any
	}{
		{"order.placed", map[string]any{"customer": "alice", "email": "alice@example.com", "currency": "EUR", "total_cents": 2500,
			"items": []map[string]any{{"sku": "BOOK-1", "quantity": 2, "unit_price_cents": 1250}}, "placed_at": now}},
		{"order.paid", map[string]any{"email": "alice@example.com", "currency": "EUR", "total_cents": 2500, "paid_at": now}},
		{"order.cancelled", map[string]any{"email": "alice@example.com", "previous_status": "paid", "cancelled_at": now}},
		{"order.refund_requested", map[string]any{"currency": "EUR", "amount_cents": 2500, "requested_at": now}},
	}
	var recs []*kgo.Record
	for i, e := range events {
		recs = append(recs, orderRecord(t, id, i+1, e.typ, e.payload))
	}
	return recs
}

// orderRecord is one order event in the relay's record format (R7).
func orderRecord(t *testing.T, id uuid.UUID, version int, typ string, payload map[string]any) *kgo.Record {
	t.Helper()
	now := time.Now().UTC().Format(time.RFC3339Nano)
	payload["order_id"] = id.String()
	value, err := json.Marshal(payload)
	require.NoError(t, err)
	h := func(k, v string) kgo.RecordHeader { return kgo.RecordHeader{Key: k, Value: []byte(v)} }
	return &kgo.Record{Key: []byte(id.String()), Value: value, Headers: []kgo.RecordHeader{
		h("ce_specversion", "1.0"), h("ce_id", uuid.NewString()), h("ce_type", typ), h("ce_source", notify.DefaultSource),
		h("ce_subject", id.String()), h("ce_time", now), h("content-type", "application/json"),
		h("ce_aggregatetype", "order"), h("ce_aggregateversion", strconv.Itoa(version)), h("ce_schemaversion", "1"),
	}}
}

func header(r *kgo.Record, key string) []byte {
	for _, h := range r.Headers {
		if h.Key == key {
			return h.Value
		}
	}
	return nil
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

func get(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// metricSum adds up every series whose line starts with prefix in the
// /metrics exposition.
func metricSum(t *testing.T, base, prefix string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		require.NoError(t, err)
		sum += v
	}
	return sum
}

// TestReadyzReportsConsumer: /readyz carries the consumer's own view as
// information (degraded, stalled partitions) without letting it decide the
// status, which follows the database and the schema.
func TestReadyzReportsConsumer(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, schema.Notifier()...)
	h := notify.Health{Degraded: "since 2026-01-01T00:00:00Z: database unreachable", Stalled: []string{"orders.events/3 (lag 7, …)"}}
	srv := httptest.NewServer(newHandler(db.Pool, prometheus.NewRegistry(), migrate.NewSchemaCheck(db.Pool, schema.Notifier()),
		func() notify.Health { return h }))
	defer srv.Close()
	res, err := http.Get(srv.URL + "/readyz")
	require.NoError(t, err)
	defer res.Body.Close()
	var body map[string]any
	require.NoError(t, json.NewDecoder(res.Body).Decode(&body))
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, "degraded "+h.Degraded, body["consumer"])
	require.Equal(t, []any{h.Stalled[0]}, body["stalled_partitions"])
}
