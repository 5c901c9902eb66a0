package traceflow_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/mail"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/notify"
	"github.com/outboxref/orders/internal/notify/smtptest"
	"github.com/outboxref/orders/internal/orders"
	"github.com/outboxref/orders/internal/ordersapi"
	"github.com/outboxref/orders/internal/outbox/relay"
	"github.com/outboxref/orders/internal/pgtest"
	"github.com/outboxref/orders/internal/telemetry"
	"github.com/outboxref/orders/internal/testlog"
)

const (
	topic         = "orders.events"
	tokens        = "dev-alice=alice:customer,dev-notifier=notifier:service"
	customerToken = "dev-alice"
	serviceToken  = "dev-notifier"
)

// The recorder sees every span of the test binary. The tests tell their
// spans apart by trace id, so they may share it and run in parallel.
var (
	recorder = tracetest.NewSpanRecorder()
	provider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
)

// TestMain installs the recorder's provider and the services' propagator
// globally, as telemetry.Setup does in both binaries. The components that
// take a TracerProvider are also given it explicitly; the orders API
// client of the notifier and the HTTP server's header extraction use the
// globals.
func TestMain(m *testing.M) {
	otel.SetTracerProvider(provider)
	otel.SetTextMapPropagator(telemetry.Propagator())
	os.Exit(m.Run())
}

// chain is the orders service (API, outbox, relay) and, when started, the
// notifier, all in this process, logging JSON through telemetry.LogHandler
// into one buffer.
type chain struct {
	ordersPool   *pgxpool.Pool
	notifierPool *pgxpool.Pool
	broker       string
	api          *httptest.Server
	smtp         *smtptest.Server
	logs         *testlog.Buffer
	log          *slog.Logger
}

// newChain starts the orders side: database, broker, relay and API.
func newChain(t *testing.T) *chain {
	t.Helper()
	c := &chain{logs: &testlog.Buffer{}}
	c.log = slog.New(telemetry.LogHandler(slog.NewJSONHandler(c.logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	c.ordersPool = pgtest.New(t, schema.Orders()...).Pool

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	c.broker = cluster.ListenAddrs()[0]

	types, err := orders.EventTypes()
	require.NoError(t, err)
	rel, err := relay.NewRelay(relay.Config{
		Pool: c.ordersPool, Kafka: []kgo.Opt{kgo.SeedBrokers(c.broker)}, Topic: topic, Source: "urn:outboxref:orders",
		Types: types, PollInterval: 100 * time.Millisecond, Logger: c.log, TracerProvider: provider,
	})
	require.NoError(t, err)
	background(t, rel.Run)

	svc, err := orders.NewService(c.ordersPool, orders.WithLogger(c.log), orders.WithNudge(rel.Nudge))
	require.NoError(t, err)
	tk, err := auth.ParseTokens(tokens)
	require.NoError(t, err)
	c.api = httptest.NewServer(ordersapi.New(ordersapi.Config{Service: svc, Tokens: tk, Log: c.log, TracerProvider: provider}))
	t.Cleanup(c.api.Close)
	return c
}

// startNotifier starts the notifier: consumer, inbox, ledger and sender.
func (c *chain) startNotifier(t *testing.T) {
	t.Helper()
	c.notifierPool = pgtest.New(t, schema.Notifier()...).Pool
	c.smtp = smtptest.Start(t)
	group := "notifier-" + uuid.NewString()[:8]
	svc, err := notify.NewService(c.notifierPool, notify.Config{
		Consumer: notify.ConsumerConfig{
			Brokers: []string{c.broker}, Topic: topic, Group: group, InstanceID: group + "-1", SessionTimeout: 6 * time.Second,
			ExtraOpts: []kgo.Opt{kgo.FetchMaxWait(100 * time.Millisecond), kgo.HeartbeatInterval(500 * time.Millisecond)},
		},
		Sender: notify.SenderConfig{
			From: "orders@shop.test", Owner: "test", Policy: notify.PolicyHold, PollInterval: 50 * time.Millisecond,
			SendingTimeout: time.Minute, MaxAttempts: 5, BackoffBase: 20 * time.Millisecond, BackoffCap: 100 * time.Millisecond,
		},
		Mailer:            &notify.SMTPMailer{Addr: c.smtp.Addr, HeloName: "notifier.test", Timeout: 5 * time.Second},
		Orders:            notify.NewOrdersClient(c.api.URL, serviceToken, 2*time.Second),
		GapWindow:         time.Minute,
		ResyncInterval:    time.Second,
		ProcessedEventTTL: 24 * time.Hour,
		CleanupInterval:   time.Hour,
		CleanupBatch:      100,
		StatsInterval:     time.Second,
		Registerer:        prometheus.NewRegistry(),
		Logger:            c.log,
		TracerProvider:    provider,
	})
	require.NoError(t, err)
	background(t, svc.Run)
}

// background runs fn until the test ends, then stops it and waits.
func background(t *testing.T, fn func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("a worker did not stop within 30s")
		}
	})
}

// placeOrder runs POST /orders as alice, with the caller's own traceparent
// when one is given, and returns the new order's id.
func (c *chain) placeOrder(t *testing.T, traceparent string) string {
	t.Helper()
	body := `{"email": "alice@example.com", "currency": "EUR", "items": [{"sku": "BOOK-42", "quantity": 2, "unit_price_cents": 1250}]}`
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, c.api.URL+"/orders", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+customerToken)
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusCreated, res.StatusCode)
	var o struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.NewDecoder(res.Body).Decode(&o))
	return o.ID
}

// spansOf waits until the recorder holds an ended span for every name in
// want within the trace, then returns the trace's spans by name. Names
// are unique within these tests' traces.
func spansOf(t *testing.T, traceID trace.TraceID, want ...string) map[string]sdktrace.ReadOnlySpan {
	t.Helper()
	var got map[string]sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		got = map[string]sdktrace.ReadOnlySpan{}
		for _, s := range recorder.Ended() {
			if s.SpanContext().TraceID() == traceID {
				got[s.Name()] = s
			}
		}
		for _, n := range want {
			if got[n] == nil {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "spans of trace %s: want %v", traceID, want)
	return got
}

// readRecord reads the topic from the start until the record keyed key.
func (c *chain) readRecord(t *testing.T, key string) map[string]string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.broker), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "no record keyed %s on the topic", key)
		var headers map[string]string
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Key) == key {
				headers = map[string]string{}
				for _, h := range r.Headers {
					headers[h.Key] = string(h.Value)
				}
			}
		})
		if headers != nil {
			return headers
		}
	}
}

// logLine waits for a log line with msg whose trace_id is traceID and
// returns it. Waiting matters for the relay's line: it is written after
// the confirm, which may follow the email.
func (c *chain) logLine(t *testing.T, msg string, traceID trace.TraceID) map[string]any {
	t.Helper()
	var line map[string]any
	require.Eventually(t, func() bool {
		for _, l := range strings.Split(strings.TrimSpace(c.logs.String()), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == msg && m["trace_id"] == traceID.String() {
				line = m
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "no log line %q with trace_id %s in:\n%s", msg, traceID, c.logs)
	return line
}

// traceparent formats a sampled W3C traceparent.
func traceparent(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
}

// TestOneTraceFromOrderToEmail (L4): POST /orders, its outbox row, the
// Kafka record, the relay's produce span, the notifier's consume, apply
// and send spans, their log lines and the email all carry one trace id,
// and each span is the child of the one before it:
//
//	caller ─▶ POST /orders (server) ─▶ send orders.events (producer) ─┬▶ process orders.events (consumer) ─▶ inbox apply
//	           │ row's traceparent        │ record's traceparent      └▶ smtp send (client), from the ledger row
//	                                      └ link: outbox relay batch (a trace of its own)
func TestOneTraceFromOrderToEmail(t *testing.T) {
	t.Parallel()
	c := newChain(t)
	c.startNotifier(t)

	// The caller's own span: the API's server span is its child, and the
	// caller's span id reaches nothing downstream.
	caller := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID(uuid.New()), SpanID: trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled,
	})
	orderID := c.placeOrder(t, traceparent(caller))
	traceID := caller.TraceID()

	spans := spansOf(t, traceID, "POST /orders", "send "+topic, "process "+topic, "inbox apply", "smtp send")
	server, produce := spans["POST /orders"], spans["send "+topic]
	consume, apply, send := spans["process "+topic], spans["inbox apply"], spans["smtp send"]

	require.Equal(t, trace.SpanKindServer, server.SpanKind())
	require.Equal(t, caller.SpanID(), server.Parent().SpanID(), "the server span continues the caller's trace")

	var eventID uuid.UUID
	var stored string
	require.NoError(t, c.ordersPool.QueryRow(t.Context(), "SELECT event_id, traceparent FROM outbox WHERE aggregate_id = $1", orderID).Scan(&eventID, &stored))
	require.Equal(t, traceparent(server.SpanContext()), stored, "the outbox row stores the server span, not the caller's header")

	require.Equal(t, trace.SpanKindProducer, produce.SpanKind())
	require.Equal(t, server.SpanContext().SpanID(), produce.Parent().SpanID(), "the produce span continues the row's context")
	require.Len(t, produce.Links(), 1)
	batch := produce.Links()[0].SpanContext
	require.NotEqual(t, traceID, batch.TraceID(), "linked to the relay's batch span, which is a trace of its own")
	require.Equal(t, traceparent(produce.SpanContext()), c.readRecord(t, orderID)["traceparent"], "the record carries the produce span's context")

	require.Equal(t, trace.SpanKindConsumer, consume.SpanKind())
	require.Equal(t, produce.SpanContext().SpanID(), consume.Parent().SpanID(), "the consume span is a child of the record's context")
	require.Equal(t, consume.SpanContext().SpanID(), apply.Parent().SpanID(), "the apply span is a child of the consume span")
	require.Equal(t, trace.SpanKindClient, send.SpanKind())
	require.Equal(t, produce.SpanContext().SpanID(), send.Parent().SpanID(), "the send span is a child of the record's context, kept in the ledger")

	var ledger *string
	require.NoError(t, c.notifierPool.QueryRow(t.Context(), "SELECT traceparent FROM email_send WHERE event_id = $1", eventID).Scan(&ledger))
	require.NotNil(t, ledger)
	require.Equal(t, traceparent(produce.SpanContext()), *ledger)

	var email *smtptest.Message
	for _, m := range c.smtp.Accepted() {
		if m.MessageID == notify.MessageID(eventID) {
			email = &m
		}
	}
	require.NotNil(t, email, "the email was sent before its send span ended")
	msg, err := mail.ReadMessage(bytes.NewReader(email.Raw))
	require.NoError(t, err)
	require.Equal(t, traceID.String(), msg.Header.Get("X-Trace-Id"))

	// Log lines written inside a span carry its ids.
	for msg, span := range map[string]sdktrace.ReadOnlySpan{
		"http request": server,
		"order command committed; event recorded in outbox": server,
		"outbox event delivered":                            produce,
		"event applied":                                     consume,
		"email sent":                                        send,
	} {
		line := c.logLine(t, msg, traceID)
		require.Equal(t, span.SpanContext().SpanID().String(), line["span_id"], msg)
	}
}

// TestResyncCallJoinsTrace (L4): the notifier's call to the orders API for
// a resync (C3) runs in an HTTP client span of the caller's trace, and the
// API's server span is its child, so a resync shows in the trace that
// needed it.
func TestResyncCallJoinsTrace(t *testing.T) {
	t.Parallel()
	c := newChain(t)
	orderID := c.placeOrder(t, "")

	ctx, resync := provider.Tracer("test").Start(t.Context(), "resync")
	snap, err := notify.NewOrdersClient(c.api.URL, serviceToken, 5*time.Second).Fetch(ctx, notify.AggregateType, orderID)
	resync.End()
	require.NoError(t, err)
	require.EqualValues(t, 1, snap.Version)

	// The resync reads the order and then which event owns each version
	// (C7): two requests, each in a client span of its own.
	spans := spansOf(t, resync.SpanContext().TraceID(), "resync", "GET /orders/{id}", "GET /orders/{id}/events")
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range recorder.Ended() {
		if s.SpanContext().TraceID() == resync.SpanContext().TraceID() {
			byID[s.SpanContext().SpanID()] = s
		}
	}
	for _, name := range []string{"GET /orders/{id}", "GET /orders/{id}/events"} {
		server := spans[name]
		require.Equal(t, trace.SpanKindServer, server.SpanKind(), name)
		client := byID[server.Parent().SpanID()]
		require.NotNil(t, client, "%s: the API's server span is a child of the notifier's request", name)
		require.Equal(t, trace.SpanKindClient, client.SpanKind(), "%s: the request ran in a client span", name)
		require.Equal(t, resync.SpanContext().SpanID(), client.Parent().SpanID(), "%s: the client span is the resync's child", name)
	}
}
