package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/notify"
	"github.com/outboxref/orders/internal/notifyapi"
)

// TestAdminCLI runs `notifier admin` against a live `notifier serve` that
// consumes from a Kafka cluster: a record in a schema version this
// notifier does not read is parked by the consumer, listed, shown, retried
// in vain (still parked, exit status non-zero); a record parked by an
// older notifier is retried and applied, and its email goes out; a
// conflict is listed; an unknown email is resolved; skipped emails are
// listed with their reasons. Every write has its audit row with the
// token's subject and the reason.
func TestAdminCLI(t *testing.T) {
	t.Parallel()
	w := newServeWorld(t)
	s := startServe(t, w.env(t, map[string]string{"AUTH_TOKENS": "adm=ops:admin,cus=alice:customer"}))
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, w.dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	prod, err := kgo.NewClient(kgo.SeedBrokers(w.broker), kgo.DefaultProduceTopic("orders.events"))
	require.NoError(t, err)
	t.Cleanup(prod.Close)

	admin := func(t *testing.T, args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		err := run(ctx, append([]string{"admin"}, args...), envFrom(map[string]string{"ADMIN_API_URL": s.base, "ADMIN_API_TOKEN": "adm"}), &out)
		return out.String(), err
	}
	mustAdmin := func(t *testing.T, args ...string) string {
		t.Helper()
		out, err := admin(t, args...)
		require.NoError(t, err, "notifier admin %v: %s", args, out)
		return out
	}
	audit := func(t *testing.T, target string) (actor, reason string, before, after []byte) {
		t.Helper()
		require.NoError(t, conn.QueryRow(ctx, `SELECT actor, reason, before_sha256, after_sha256 FROM admin_audit WHERE target = $1`, target).
			Scan(&actor, &reason, &before, &after))
		return
	}

	// The consumer parks an order.placed in schema version 2.
	v2 := orderRecord(t, uuid.New(), 1, "order.placed", map[string]any{"customer": "alice", "email": "alice@example.com",
		"currency": "EUR", "total_cents": 100, "items": []map[string]any{}})
	setHeader(v2, "ce_schemaversion", "2")
	require.NoError(t, prod.ProduceSync(ctx, v2).FirstErr())
	v2ID := string(header(v2, "ce_id"))
	var listing string
	require.Eventually(t, func() bool {
		listing, _ = admin(t, "parked")
		return strings.Contains(listing, v2ID)
	}, 20*time.Second, 50*time.Millisecond)
	require.Regexp(t, `(?m)^ID\s+POSITION\s+EVENT_ID\s+PARKED_AT\s+RESOLUTION\s+RETRIES\s+REASON$`, listing)
	m := regexp.MustCompile(`(?m)^(\d+)\s+orders\.events/\d+@\d+\s+` + v2ID + `\s+\S+\s+-\s+0\s+.*schema version 2 is not supported`).FindStringSubmatch(listing)
	require.NotNil(t, m, listing)
	id := m[1]

	var list notifyapi.ParkedList
	require.NoError(t, json.Unmarshal([]byte(mustAdmin(t, "parked", "--json")), &list))
	require.Len(t, list.Records, 1)
	require.Equal(t, v2ID, list.Records[0].EventID.String())

	shown := mustAdmin(t, "parked", "show", id)
	require.Contains(t, shown, "event_id:   "+v2ID)
	require.Regexp(t, `ce_schemaversion\s+"2"`, shown)
	require.Contains(t, shown, `"email":"alice@example.com"`, "the value is shown as text")

	t.Run("RetryStillFailing", func(t *testing.T) {
		out, err := admin(t, "retry", id, "--reason", "trying before the v2 reader ships")
		require.ErrorContains(t, err, "still failing, still parked")
		require.Contains(t, out, "retry: parked record "+id+" still fails and stays parked")
		require.Regexp(t, `(?m)^`+id+`\s+.*still_failing\s+1\s+`, mustAdmin(t, "parked"))
		actor, reason, before, after := audit(t, "inbox_parked_record/"+id)
		require.Equal(t, "ops", actor)
		require.Equal(t, "trying before the v2 reader ships", reason)
		require.NotEqual(t, before, after)
	})

	t.Run("RetryAppliedAndEmailed", func(t *testing.T) {
		// Parked by an older notifier that could not read this event;
		// the notifier now deployed can.
		placed := orderRecord(t, uuid.New(), 1, "order.placed", map[string]any{"customer": "bob", "email": "bob@example.com",
			"currency": "EUR", "total_cents": 900, "items": []map[string]any{{"sku": "PEN-1", "quantity": 1, "unit_price_cents": 900}},
			"placed_at": time.Now().UTC().Format(time.RFC3339)})
		placed.Topic = "orders.events"
		_, err := inbox.ParkRecord(ctx, conn, placed, "processing failed 5 times: bug fixed in 1.4.1")
		require.NoError(t, err)
		var parked int64
		require.NoError(t, conn.QueryRow(ctx, "SELECT max(id) FROM inbox_parked_record").Scan(&parked))

		_, err = admin(t, "retry", strconv.FormatInt(parked, 10))
		require.ErrorContains(t, err, "--reason is required")
		out := mustAdmin(t, "retry", strconv.FormatInt(parked, 10), "--reason=bug fixed in 1.4.1")
		require.Contains(t, out, "applied, inbox outcome applied")
		eventID := uuid.MustParse(string(header(placed, "ce_id")))
		require.Eventually(t, func() bool { return w.mail.Count(notify.MessageID(eventID)) == 1 }, 20*time.Second, 50*time.Millisecond,
			"the retried event's email is sent")
		require.NotContains(t, mustAdmin(t, "parked"), eventID.String(), "resolved records are not listed")
		require.Regexp(t, `(?m)^`+strconv.FormatInt(parked, 10)+`\s+.*applied\s+1\s+`, mustAdmin(t, "parked", "--all"))
		actor, reason, before, after := audit(t, "inbox_parked_record/"+strconv.FormatInt(parked, 10))
		require.Equal(t, "ops", actor)
		require.Equal(t, "bug fixed in 1.4.1", reason)
		require.Len(t, after, 32)
		require.NotEqual(t, before, after)
	})

	t.Run("Conflicts", func(t *testing.T) {
		order := uuid.New()
		payload := map[string]any{"customer": "carol", "email": "carol@example.com", "currency": "EUR", "total_cents": 1,
			"items": []map[string]any{{"sku": "PEN", "quantity": 1, "unit_price_cents": 1}}, "placed_at": time.Now().UTC().Format(time.RFC3339)}
		owner, rival := orderRecord(t, order, 1, "order.placed", payload), orderRecord(t, order, 1, "order.placed", payload)
		require.NoError(t, prod.ProduceSync(ctx, owner, rival).FirstErr())
		var out string
		require.Eventually(t, func() bool {
			out = mustAdmin(t, "conflicts")
			return strings.Contains(out, string(header(rival, "ce_id")))
		}, 20*time.Second, 50*time.Millisecond)
		require.Regexp(t, string(header(rival, "ce_id"))+`\s+order/`+order.String()+`\s+1\s+order.placed\s+`+string(header(owner, "ce_id")), out)
	})

	t.Run("ResolveEmail", func(t *testing.T) {
		eventID := uuid.New()
		key := notify.OperationKey(eventID)
		_, err := conn.Exec(ctx, `INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type, recipient,
			subject, body, state, attempts, last_error, next_attempt_at) VALUES ($1, $2, $3, $4, 'order.paid', 'a@example.com', 's', 'b',
			'unknown', 1, 'connection lost after DATA', now() + interval '1 hour')`, key, eventID, notify.MessageID(eventID), uuid.New())
		require.NoError(t, err)
		require.Regexp(t, key+`\s+`+eventID.String()+`\s+order.paid\s+\S+\s+unknown\s+1\s+\S+\s+connection lost after DATA`, mustAdmin(t, "emails"))

		_, err = admin(t, "resolve-email", key, "sent")
		require.ErrorContains(t, err, "--reason is required")
		out := mustAdmin(t, "resolve-email", key, "sent", "--reason", "delivered per the provider's log")
		require.Contains(t, out, "resolve-email: "+key+" marked sent by ops, now sent")
		require.NotContains(t, mustAdmin(t, "emails", "unknown"), key)
		require.Contains(t, mustAdmin(t, "emails", "sent"), key)
		var res []notifyapi.Email
		var list notifyapi.EmailList
		require.NoError(t, json.Unmarshal([]byte(mustAdmin(t, "emails", "sent", "--json")), &list))
		for _, e := range list.Emails {
			if e.OperationKey == key {
				res = append(res, e)
			}
		}
		require.Len(t, res, 1)
		require.Equal(t, "ops", res[0].ResolvedBy)
		actor, reason, before, after := audit(t, "email_send/"+key)
		require.Equal(t, "ops", actor)
		require.Equal(t, "delivered per the provider's log", reason)
		require.NotEqual(t, before, after)

		_, err = admin(t, "resolve-email", key, "sent", "--reason", "again")
		require.ErrorContains(t, err, "409 Conflict: only an unknown or failed email can be resolved")
	})

	t.Run("EmailsSkipped", func(t *testing.T) {
		// Emails never sent on purpose are listed with their reasons.
		stale, conflict, sent := uuid.New(), uuid.New(), uuid.New()
		for _, r := range []struct {
			id     uuid.UUID
			state  string
			reason *string
		}{{stale, "skipped", ptr("stale")}, {conflict, "skipped", ptr("conflict")}, {sent, "sent", nil}} {
			_, err := conn.Exec(ctx, `INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
				recipient, subject, body, state, skip_reason) VALUES ($1, $2, $3, $4, 'order.placed', 'a@example.com', 's', 'b', $5, $6)`,
				notify.OperationKey(r.id), r.id, notify.MessageID(r.id), uuid.New(), r.state, r.reason)
			require.NoError(t, err)
		}
		out := mustAdmin(t, "emails", "skipped")
		require.Regexp(t, stale.String()+`\s+order.placed\s+\S+\s+skipped\s+0\s+\S+\s+stale`, out)
		require.Regexp(t, conflict.String()+`\s+order.placed\s+\S+\s+skipped\s+0\s+\S+\s+conflict`, out)
		require.NotContains(t, out, sent.String())
	})

	t.Run("Refused", func(t *testing.T) {
		var out bytes.Buffer
		err := run(ctx, []string{"admin", "parked"}, envFrom(map[string]string{"ADMIN_API_URL": s.base, "ADMIN_API_TOKEN": "cus"}), &out)
		require.ErrorContains(t, err, "403 Forbidden: the admin role is required")
		err = run(ctx, []string{"admin", "parked"}, envFrom(map[string]string{"ADMIN_API_URL": s.base}), &out)
		require.ErrorContains(t, err, "ADMIN_API_TOKEN is required")
		_, err = admin(t, "emails", "lost")
		require.ErrorContains(t, err, "400")
		_, err = admin(t, "frobnicate")
		require.ErrorContains(t, err, `unknown command "frobnicate"`)
		_, err = admin(t, "parked", "--limit")
		require.ErrorContains(t, err, "--limit needs a value")
	})
}

func ptr[T any](v T) *T { return &v }

func setHeader(r *kgo.Record, key, value string) {
	for i, h := range r.Headers {
		if h.Key == key {
			r.Headers[i].Value = []byte(value)
		}
	}
}

// TestAdminCLIChecksReasonAndPrintsSafely: a --reason the server would
// refuse (a control character, over 1024 characters) fails before
// anything is sent, in the server's words; text from the server (a parked
// record's reason and key come from whoever wrote to the topic) prints
// with its control characters escaped, so it cannot rewrite the terminal.
func TestAdminCLIChecksReasonAndPrintsSafely(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { calls.Add(1) }))
	t.Cleanup(srv.Close)
	env := envFrom(map[string]string{"ADMIN_API_URL": srv.URL, "ADMIN_API_TOKEN": "adm"})
	for reason, want := range map[string]string{
		"x\napproved by ops2":     "--reason: reason must not contain control characters (found U+000A)",
		"\x1b[2Kfine":             "(found U+001B)",
		strings.Repeat("a", 1025): "--reason: reason must be at most 1024 characters (it has 1025)",
	} {
		err := run(context.Background(), []string{"admin", "retry", "7", "--reason", reason}, env, io.Discard)
		require.ErrorContains(t, err, want)
		err = run(context.Background(), []string{"admin", "resolve-email", "k", "sent", "--reason", reason}, env, io.Discard)
		require.ErrorContains(t, err, want)
	}
	require.Zero(t, calls.Load(), "nothing was sent")

	var out bytes.Buffer
	key := "k\x1b]0;owned\x07"
	printParked(&out, notifyapi.ParkedList{Records: []notifyapi.ParkedRecord{{ID: 1, Topic: "orders.events", Reason: "bad\r\x1b[2Kfine"}},
		Events: []notifyapi.ParkedEvent{{AggregateID: "a\nb", EventType: "order.placed", Reason: "held\u202eevil"}}})
	printParkedRecord(&out, notifyapi.ParkedRecord{ID: 1, Reason: "x\napproved by ops2", Key: &key, Value: &key})
	printEmails(&out, []notifyapi.Email{{OperationKey: "k", LastError: "550\r\x1b[1Aok"}})
	require.NotRegexp(t, "[\x00-\x08\x0b-\x1f\x7f\u202e]", out.String(), "no control character reaches the terminal")
	require.Contains(t, out.String(), `bad\r\x1b[2Kfine`)
	require.Contains(t, out.String(), `x\napproved by ops2`)
	require.Contains(t, out.String(), `held\u202eevil`)
}
