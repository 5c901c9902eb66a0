package notifyapi_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/notify"
	"github.com/outboxref/orders/internal/notify/notifydb"
	"github.com/outboxref/orders/internal/notifyapi"
	"github.com/outboxref/orders/internal/outbox/adminguard"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
	"github.com/outboxref/orders/internal/outbox/problem"
	"github.com/outboxref/orders/internal/pgtest"
)

// The tokens of every test: one per role, and an admin whose subject is
// longer than the audit trail accepts.
const tokens = "adm=ops:admin,cus=alice:customer,svc=notifier:service"

// world is one test's admin API over a fresh notifier database.
type world struct {
	pool   *pgxpool.Pool
	ib     *inbox.Inbox
	srv    *httptest.Server
	admin  *notifyapi.Client // with the admin token
	nudges *atomic.Int32
}

type option func(*notify.AdminConfig, *string)

// withDecode replaces the notifier's decoder for retries (a fix deployed).
func withDecode(d inbox.DecodeFunc) option {
	return func(c *notify.AdminConfig, _ *string) { c.Decode = d }
}

// withTokens replaces the token table.
func withTokens(spec string) option { return func(_ *notify.AdminConfig, s *string) { *s = spec } }

func setup(t *testing.T, opts ...option) *world {
	t.Helper()
	db := pgtest.New(t, schema.Notifier()...)
	log := slog.New(slog.DiscardHandler)
	proj := notify.NewProjector(log)
	ib, err := inbox.New(inbox.Config{Pool: db.Pool, Apply: proj.Apply, Covered: proj.Covered, Rejected: proj.Rejected,
		GapWindow: time.Minute, Logger: log})
	require.NoError(t, err)
	w := &world{pool: db.Pool, ib: ib, nudges: &atomic.Int32{}}
	cfg := notify.AdminConfig{Pool: db.Pool, Inbox: ib, Nudge: func() { w.nudges.Add(1) }, Logger: log}
	spec := tokens
	for _, o := range opts {
		o(&cfg, &spec)
	}
	tt, err := auth.ParseTokens(spec)
	require.NoError(t, err)
	w.srv = httptest.NewServer(notifyapi.New(notifyapi.Config{Admin: notify.NewAdmin(cfg), Tokens: tt, Log: log}))
	t.Cleanup(w.srv.Close)
	w.admin = notifyapi.NewClient(w.srv.URL, "adm")
	return w
}

// orderRecord is a fixture factory: the relay's record of an order event
// (R7): version 1 of a fresh order, in the given schema version.
func orderRecord(schemaVersion int) *kgo.Record {
	id := uuid.New()
	payload, _ := json.Marshal(map[string]any{"order_id": id.String(), "customer": "alice", "email": "alice@example.com",
		"currency": "EUR", "total_cents": 2500, "items": []map[string]any{{"sku": "BOOK-1", "quantity": 2, "unit_price_cents": 1250}},
		"placed_at": time.Now().UTC().Format(time.RFC3339)})
	r := cloudevents.Record("orders.events", cloudevents.Event{ID: uuid.New(), Type: notify.TypePlaced, Source: "urn:outboxref:orders",
		Time: time.Now(), AggregateType: notify.AggregateType, AggregateID: id.String(), AggregateVersion: 1, SchemaVersion: schemaVersion, Data: payload})
	r.Partition, r.Offset = 2, 17
	return r
}

// park parks r with reason, as the consumer does, and returns its id.
func (w *world) park(t *testing.T, r *kgo.Record, reason string) int64 {
	t.Helper()
	ctx := context.Background()
	_, err := inbox.ParkRecord(ctx, w.pool, r, reason)
	require.NoError(t, err)
	var id int64
	require.NoError(t, w.pool.QueryRow(ctx, "SELECT max(id) FROM inbox_parked_record").Scan(&id))
	return id
}

// email inserts a ledger row in state and returns its operation key.
func (w *world) email(t *testing.T, state string) string {
	t.Helper()
	id := uuid.New()
	var skip *string
	if state == notify.StateSkipped {
		s := notify.SkipStale
		skip = &s
	}
	_, err := w.pool.Exec(context.Background(), `INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
		recipient, subject, body, state, skip_reason, attempts, last_error_class, last_error)
		VALUES ($1, $2, $3, $4, 'order.placed', 'a@example.com', 's', 'b', $5, $6, 1, 'unknown', 'connection lost after DATA')`,
		notify.OperationKey(id), id, notify.MessageID(id), uuid.New(), state, skip)
	require.NoError(t, err)
	return notify.OperationKey(id)
}

// audit returns the audit trail of target.
func (w *world) audit(t *testing.T, target string) []notifydb.AdminAudit {
	t.Helper()
	rows, err := notifydb.New(w.pool).AdminAuditListForTarget(context.Background(), target)
	require.NoError(t, err)
	return rows
}

// rowHash recomputes the hash of a row the way the audit trail records it.
func (w *world) rowHash(t *testing.T, query string, arg any) []byte {
	t.Helper()
	var h []byte
	require.NoError(t, pgx.BeginFunc(context.Background(), w.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(context.Background(), "SET LOCAL TimeZone = 'UTC'"); err != nil {
			return err
		}
		return tx.QueryRow(context.Background(), query, arg).Scan(&h)
	}))
	return h
}

func requireProblem(t *testing.T, err error, status int) *problem.Problem {
	t.Helper()
	var p *problem.Problem
	require.True(t, errors.As(err, &p), "want a problem, got %v", err)
	require.Equal(t, status, p.Status, "problem: %v", p)
	return p
}

func send(t *testing.T, method, url, token, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, string(b)
}

// TestAuth (S1): every endpoint needs a token (401 without one or with an
// unknown one, with a problem and a WWW-Authenticate challenge), and the
// admin role (403 for customer and service tokens); an admin gets through.
// Unknown paths under /admin are not revealed to the unauthenticated.
func TestAuth(t *testing.T) {
	t.Parallel()
	w := setup(t)
	id := w.park(t, orderRecord(2), "schema version 2 is not supported")
	key := w.email(t, notify.StateUnknown)
	for _, ep := range []struct {
		method, path, body string
		admin              int
	}{
		{"GET", "/admin/parked", "", 200},
		{"GET", "/admin/parked/" + itoa(id), "", 200},
		{"POST", "/admin/parked/" + itoa(id) + "/retry", `{"reason":"checking auth"}`, 200},
		{"GET", "/admin/conflicts", "", 200},
		{"GET", "/admin/emails?state=unknown", "", 200},
		{"POST", "/admin/emails/" + key + "/resolve", `{"resolution":"sent","reason":"in the relay's log"}`, 200},
		{"GET", "/admin/nothing-here", "", 404},
	} {
		t.Run(strings.ReplaceAll(ep.method+ep.path, "/", "_"), func(t *testing.T) {
			for _, tc := range []struct {
				token string
				want  int
			}{{"", 401}, {"forged", 401}, {"cus", 403}, {"svc", 403}, {"adm", ep.admin}} {
				res, body := send(t, ep.method, w.srv.URL+ep.path, tc.token, ep.body)
				require.Equal(t, tc.want, res.StatusCode, "token %q: %s", tc.token, body)
				if tc.want >= 400 {
					require.Equal(t, problem.MediaType, res.Header.Get("Content-Type"))
				} else {
					require.Equal(t, "application/json", res.Header.Get("Content-Type"))
				}
				if tc.want == 401 {
					require.Equal(t, `Bearer realm="notifier"`, res.Header.Get("WWW-Authenticate"))
				}
			}
		})
	}
	// Only the admin's writes went through, once each.
	require.Len(t, w.audit(t, "inbox_parked_record/"+itoa(id)), 1)
	require.Len(t, w.audit(t, "email_send/"+key), 1)

	t.Run("DisabledWithoutTokens", func(t *testing.T) {
		srv := httptest.NewServer(notifyapi.New(notifyapi.Config{}))
		defer srv.Close()
		res, body := send(t, "GET", srv.URL+"/admin/parked", "adm", "")
		require.Equal(t, http.StatusNotFound, res.StatusCode)
		require.Contains(t, body, notifyapi.TypeDisabled)
	})
}

// TestParked: the list shows open parked records (and held events parked)
// with their identifiers and reasons; one record shows its headers as
// stored, and its value as text when it is UTF-8, base64 otherwise.
func TestParked(t *testing.T) {
	t.Parallel()
	w := setup(t)
	ctx := context.Background()
	v2 := orderRecord(2)
	textID := w.park(t, v2, "order.placed schema version 2 is not supported (this notifier reads v1)")
	binary := &kgo.Record{Topic: "orders.events", Partition: 1, Offset: 9, Key: []byte{0xff, 0}, Value: []byte{0xde, 0xad, 0xbe, 0xef},
		Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte{0xff}}, {Key: "x", Value: []byte("ok")}}}
	binID := w.park(t, binary, "ce_id is not a UUID")

	list, err := w.admin.Parked(ctx, notifyapi.ParkedQuery{})
	require.NoError(t, err)
	require.Len(t, list.Records, 2)
	require.Empty(t, list.Events)
	first := list.Records[0]
	require.Equal(t, textID, first.ID)
	require.Equal(t, "orders.events", first.Topic)
	require.Equal(t, int32(2), first.Partition)
	require.Equal(t, int64(17), first.Offset)
	require.Equal(t, string(header(v2, "ce_id")), first.EventID.String())
	require.Contains(t, first.Reason, "schema version 2")
	require.False(t, first.ParkedAt.IsZero())
	require.Nil(t, first.Value, "the list leaves the bytes out")
	require.Nil(t, list.Records[1].EventID, "no readable event id")

	page, err := w.admin.Parked(ctx, notifyapi.ParkedQuery{Limit: 1})
	require.NoError(t, err)
	require.Equal(t, textID, page.NextAfter)
	page, err = w.admin.Parked(ctx, notifyapi.ParkedQuery{Limit: 1, After: page.NextAfter})
	require.NoError(t, err)
	require.Equal(t, binID, page.Records[0].ID)

	got, err := w.admin.ParkedRecord(ctx, textID)
	require.NoError(t, err)
	require.Equal(t, string(v2.Value), *got.Value, "UTF-8 value shown as text")
	require.Equal(t, string(v2.Key), *got.Key)
	require.Len(t, got.Headers, len(v2.Headers))
	require.Equal(t, "ce_schemaversion", got.Headers[len(got.Headers)-1].Key)
	require.Equal(t, "2", got.Headers[len(got.Headers)-1].Value)

	got, err = w.admin.ParkedRecord(ctx, binID)
	require.NoError(t, err)
	require.Nil(t, got.Value)
	require.Equal(t, binary.Value, got.ValueBase64, "binary value shown as base64")
	require.Equal(t, binary.Key, got.KeyBase64)
	require.Equal(t, []byte{0xff}, got.Headers[0].ValueBase64)
	require.Equal(t, "ok", got.Headers[1].Value)

	_, err = w.admin.ParkedRecord(ctx, 99999)
	requireProblem(t, err, http.StatusNotFound)
	res, _ := send(t, "GET", w.srv.URL+"/admin/parked/abc", "adm", "")
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	res, _ = send(t, "GET", w.srv.URL+"/admin/parked?limit=0", "adm", "")
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
}

// TestRetry (O4): retrying a parked record decodes it again and runs it
// through the inbox in one transaction with its audit row.
func TestRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// StillFailing: the notifier still does not read version 2; the record
	// stays parked with the new reason, and the attempt is audited.
	t.Run("StillFailing", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		id := w.park(t, orderRecord(2), "first reason")
		res, err := w.admin.Retry(ctx, id, "try after the v2 deploy")
		require.NoError(t, err)
		require.Equal(t, "still_failing", res.Resolution)
		require.Contains(t, res.Error, "schema version 2 is not supported")
		require.Contains(t, res.ParkedRecord.Reason, "schema version 2 is not supported")
		require.Equal(t, "ops", res.ParkedRecord.ResolvedBy)
		list, err := w.admin.Parked(ctx, notifyapi.ParkedQuery{})
		require.NoError(t, err)
		require.Len(t, list.Records, 1, "still parked")
		require.Zero(t, count(t, w.pool, "SELECT count(*) FROM processed_event"))
		requireAudit(t, w, "inbox_parked_record/"+itoa(id), "try after the v2 deploy",
			"SELECT sha256(convert_to(to_jsonb(p)::text, 'UTF8')) FROM inbox_parked_record p WHERE id = $1", id)
	})

	// DecodableNow: parked by a notifier that did not read version 2; the
	// fixed decoder reads it, the order is projected, its email intent is
	// written and the sender nudged, and the record is resolved.
	t.Run("DecodableNow", func(t *testing.T) {
		t.Parallel()
		readsV2 := func(r *kgo.Record) (inbox.Event, error) {
			for i, h := range r.Headers {
				if h.Key == cloudevents.HeaderSchemaVersion && string(h.Value) == "2" {
					r.Headers[i].Value = []byte("1") // v2 is v1 plus fields this notifier ignores
				}
			}
			return notify.DecodeRecord(r)
		}
		w := setup(t, withDecode(readsV2))
		rec := orderRecord(2)
		id := w.park(t, rec, "order.placed schema version 2 is not supported (this notifier reads v1)")
		res, err := w.admin.Retry(ctx, id, "v2 reader deployed (release 1.4)")
		require.NoError(t, err)
		require.Equal(t, "applied", res.Resolution)
		require.Equal(t, "applied", res.Outcome)
		require.Empty(t, res.Error)
		require.Equal(t, int32(1), w.nudges.Load(), "the sender is woken for the new email")
		require.Equal(t, 1, count(t, w.pool, "SELECT count(*) FROM order_projection WHERE order_id = $1", string(rec.Key)))
		eventID := uuid.MustParse(string(header(rec, "ce_id")))
		require.Equal(t, 1, count(t, w.pool, "SELECT count(*) FROM email_send WHERE event_id = $1 AND state = 'pending'", eventID))
		list, err := w.admin.Parked(ctx, notifyapi.ParkedQuery{})
		require.NoError(t, err)
		require.Empty(t, list.Records, "no longer parked")
		list, err = w.admin.Parked(ctx, notifyapi.ParkedQuery{All: true})
		require.NoError(t, err)
		require.Equal(t, "applied", list.Records[0].Resolution)
		requireAudit(t, w, "inbox_parked_record/"+itoa(id), "v2 reader deployed (release 1.4)",
			"SELECT sha256(convert_to(to_jsonb(p)::text, 'UTF8')) FROM inbox_parked_record p WHERE id = $1", id)

		_, err = w.admin.Retry(ctx, id, "again")
		p := requireProblem(t, err, http.StatusConflict)
		require.Equal(t, notifyapi.TypeAlreadyResolved, p.Type)
	})

	// ParkedByAnOlderNotifier: the code that parked it was wrong, the code
	// now deployed is not; the retry with the notifier's own decoder
	// applies it.
	t.Run("ParkedByAnOlderNotifier", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		id := w.park(t, orderRecord(1), "processing failed 5 times: a bug fixed since")
		res, err := w.admin.Retry(ctx, id, "bug fixed in 1.4.1")
		require.NoError(t, err)
		require.Equal(t, "applied", res.Resolution)
	})

	// ReasonRequired: no reason, no change and no audit row.
	t.Run("ReasonRequired", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		id := w.park(t, orderRecord(1), "parked")
		for _, body := range []string{`{}`, `{"reason":"   "}`, `{"reason":"two\nlines"}`} {
			res, text := send(t, "POST", w.srv.URL+"/admin/parked/"+itoa(id)+"/retry", "adm", body)
			require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
			require.Contains(t, text, `"field":"reason"`)
		}
		for _, body := range []string{``, `{"reason":1}`, `{"reason":"x","force":true}`} {
			res, _ := send(t, "POST", w.srv.URL+"/admin/parked/"+itoa(id)+"/retry", "adm", body)
			require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
		}
		_, err := w.admin.Retry(ctx, id, "")
		requireProblem(t, err, http.StatusBadRequest)
		require.Empty(t, w.audit(t, "inbox_parked_record/"+itoa(id)))
		got, err := w.admin.ParkedRecord(ctx, id)
		require.NoError(t, err)
		require.Empty(t, got.Resolution)
		_, err = w.admin.Retry(ctx, 4242, "no such record")
		requireProblem(t, err, http.StatusNotFound)
	})
}

// TestConflicts: a conflict is listed with the event that owns the version.
func TestConflicts(t *testing.T) {
	t.Parallel()
	w := setup(t)
	ctx := context.Background()
	owner := orderRecord(1)
	rival := orderRecord(1)
	rival.Key = owner.Key
	for i, h := range rival.Headers {
		if h.Key == cloudevents.HeaderSubject {
			rival.Headers[i].Value = owner.Key
		}
	}
	rival.Value = owner.Value
	for _, r := range []*kgo.Record{owner, rival} {
		e, err := notify.DecodeRecord(r)
		require.NoError(t, err)
		_, err = w.ib.Handle(ctx, e)
		require.NoError(t, err)
	}
	list, err := w.admin.Conflicts(ctx, 0)
	require.NoError(t, err)
	require.Len(t, list.Conflicts, 1)
	c := list.Conflicts[0]
	require.Equal(t, string(header(rival, "ce_id")), c.EventID.String())
	require.Equal(t, string(header(owner, "ce_id")), c.ExistingEventID.String())
	require.Equal(t, string(owner.Key), c.AggregateID)
	require.Equal(t, int64(1), c.AggregateVersion)
	require.Equal(t, notify.TypePlaced, c.EventType)
}

// TestEmails (C4): the ledger's rows by state, and an operator's
// resolution of an unknown or failed email, audited.
func TestEmails(t *testing.T) {
	t.Parallel()
	w := setup(t)
	ctx := context.Background()
	unknown, failed, sent := w.email(t, notify.StateUnknown), w.email(t, notify.StateFailed), w.email(t, notify.StateSent)

	list, err := w.admin.Emails(ctx, "", 0)
	require.NoError(t, err)
	require.Equal(t, "unknown", list.State, "unknown by default: what waits for an operator")
	require.Len(t, list.Emails, 1)
	require.Equal(t, unknown, list.Emails[0].OperationKey)
	require.Equal(t, "connection lost after DATA", list.Emails[0].LastError)
	_, err = w.admin.Emails(ctx, "lost", 0)
	p := requireProblem(t, err, http.StatusBadRequest)
	require.Equal(t, "state", p.Errors[0].Field)

	res, err := w.admin.ResolveEmail(ctx, unknown, "sent", "delivered per the provider's log, ticket 812")
	require.NoError(t, err)
	require.Equal(t, "sent", res.Email.State)
	require.Equal(t, "ops", res.Email.ResolvedBy)
	require.Equal(t, "sent", res.Email.Resolution)
	require.NotZero(t, res.AuditID)
	requireAudit(t, w, "email_send/"+unknown, "delivered per the provider's log, ticket 812",
		"SELECT sha256(convert_to(to_jsonb(e)::text, 'UTF8')) FROM email_send e WHERE operation_key = $1", unknown)

	res, err = w.admin.ResolveEmail(ctx, failed, "resend", "mailbox fixed by the customer")
	require.NoError(t, err)
	require.Equal(t, "pending", res.Email.State)
	require.Equal(t, int32(1), w.nudges.Load())

	_, err = w.admin.ResolveEmail(ctx, sent, "failed", "not resolvable")
	p = requireProblem(t, err, http.StatusConflict)
	require.Equal(t, notifyapi.TypeNotResolvable, p.Type)
	_, err = w.admin.ResolveEmail(ctx, "nope@notifier.outboxref", "sent", "no such row")
	requireProblem(t, err, http.StatusNotFound)
	_, err = w.admin.ResolveEmail(ctx, failed, "ignore", "bad resolution")
	p = requireProblem(t, err, http.StatusBadRequest)
	require.Equal(t, "resolution", p.Errors[0].Field)
	_, err = w.admin.ResolveEmail(ctx, failed, "failed", "")
	p = requireProblem(t, err, http.StatusBadRequest)
	require.Equal(t, "reason", p.Errors[0].Field)
	require.Empty(t, w.audit(t, "email_send/"+sent), "refused writes leave no audit row")
	require.Len(t, w.audit(t, "email_send/"+failed), 1)
}

// TestAuditInSameTransaction: the audit row is written in the change's own
// transaction, so one never commits without the other.
func TestAuditInSameTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// AuditRefused: an actor the audit trail refuses (a subject longer
	// than its 256 characters) fails the audit insert, and the resolution
	// with it: the email stays unknown.
	t.Run("AuditRefused", func(t *testing.T) {
		t.Parallel()
		w := setup(t, withTokens("long="+strings.Repeat("o", 300)+":admin"))
		key := w.email(t, notify.StateUnknown)
		_, err := notifyapi.NewClient(w.srv.URL, "long").ResolveEmail(ctx, key, "sent", "checked")
		requireProblem(t, err, http.StatusInternalServerError)
		row, err := notifydb.New(w.pool).EmailSendGet(ctx, key)
		require.NoError(t, err)
		require.Equal(t, notify.StateUnknown, row.State, "no change without its audit row")
		require.Nil(t, row.ResolvedBy)
	})

	// ChangeFailsAtCommit: a deferred check refuses the change when the
	// transaction commits, after the audit row was written; no audit row
	// is left of a change that did not happen. (An audit row written on a
	// connection of its own would survive here.)
	t.Run("ChangeFailsAtCommit", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		_, err := w.pool.Exec(ctx, `
			CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS
				$$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$;
			CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER UPDATE ON email_send
				DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_at_commit();`)
		require.NoError(t, err)
		key := w.email(t, notify.StateUnknown)
		_, err = w.admin.ResolveEmail(ctx, key, "sent", "checked")
		requireProblem(t, err, http.StatusInternalServerError)
		require.Empty(t, w.audit(t, "email_send/"+key), "no audit row of a change that rolled back")
		row, err := notifydb.New(w.pool).EmailSendGet(ctx, key)
		require.NoError(t, err)
		require.Equal(t, notify.StateUnknown, row.State)
	})
}

// requireAudit checks target's one audit row: the admin token's subject,
// the reason, two different SHA-256 hashes, the last of which is the row's
// hash now (recomputed with hashQuery).
func requireAudit(t *testing.T, w *world, target, reason, hashQuery string, arg any) {
	t.Helper()
	rows := w.audit(t, target)
	require.Len(t, rows, 1)
	a := rows[0]
	require.Equal(t, "ops", a.Actor)
	require.Equal(t, reason, a.Reason)
	require.Len(t, a.BeforeSha256, sha256.Size)
	require.Len(t, a.AfterSha256, sha256.Size)
	require.NotEqual(t, a.BeforeSha256, a.AfterSha256, "the row changed")
	require.Equal(t, w.rowHash(t, hashQuery, arg), a.AfterSha256, "the after hash is the row's current hash")
	require.WithinDuration(t, time.Now(), a.At, time.Minute)
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func header(r *kgo.Record, key string) []byte {
	for _, h := range r.Headers {
		if h.Key == key {
			return h.Value
		}
	}
	return nil
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestRefusesHostileInput: NUL, bytes that are not UTF-8 and control
// characters in a path id, a query value, a body field or key answer 400
// with a problem naming the field (the same rule and words as the
// outbox's operations API, adminguard), never 500, and nothing is stored.
// The reason's limit is 1024 characters, as in the orders service: a
// longer one is refused naming the limit, one of 1024 "é" (2048 bytes) is
// taken.
func TestRefusesHostileInput(t *testing.T) {
	t.Parallel()
	w := setup(t)
	ctx := context.Background()
	unknown := w.email(t, notify.StateUnknown)
	parked := strconv.FormatInt(w.park(t, orderRecord(9), "unknown schema version"), 10)
	stored := func() string {
		var s string
		require.NoError(t, w.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM admin_audit)::text || '/' ||
			(SELECT state FROM email_send WHERE operation_key = $1) || '/' ||
			(SELECT count(*) FROM inbox_parked_record WHERE resolution IS NULL)::text`, unknown).Scan(&s))
		return s
	}
	before := stored()
	resolve := "/admin/emails/" + unknown + "/resolve"
	long := strings.Repeat("a", adminguard.MaxReasonChars+1)

	for name, tc := range map[string]struct{ method, path, body, field, detail string }{
		"OperationKeyNUL":     {"POST", "/admin/emails/%00/resolve", `{"resolution":"sent","reason":"x"}`, "operation_key", "U+0000"},
		"OperationKeyBadUTF8": {"POST", "/admin/emails/%ff%fe/resolve", `{"resolution":"sent","reason":"x"}`, "operation_key", "valid UTF-8"},
		"ParkedIDNUL":         {"GET", "/admin/parked/%00", "", "id", "U+0000"},
		"StateNUL":            {"GET", "/admin/emails?state=%00", "", "state", "U+0000"},
		"AfterBadUTF8":        {"GET", "/admin/parked?after=%ff", "", "after", "valid UTF-8"},
		"ReasonCR":            {"POST", resolve, `{"resolution":"sent","reason":"ok\rrewritten"}`, "reason", "U+000D"},
		"ReasonESC":           {"POST", "/admin/parked/" + parked + "/retry", `{"reason":"\u001b[2Kfixed"}`, "reason", "U+001B"},
		"ReasonForgedLine":    {"POST", resolve, `{"resolution":"sent","reason":"x\napproved by ops2"}`, "reason", "U+000A"},
		"ReasonBadUTF8":       {"POST", resolve, "{\"resolution\":\"sent\",\"reason\":\"\xff\"}", "reason", "valid UTF-8"},
		"ReasonTooLong":       {"POST", resolve, `{"resolution":"sent","reason":"` + long + `"}`, "reason", "must be at most 1024 characters (it has 1025)"},
		"ResolutionNUL":       {"POST", resolve, `{"resolution":"sent\u0000","reason":"x"}`, "resolution", "U+0000"},
		"KeyNUL":              {"POST", resolve, `{"resolution":"sent","reason":"x","\u0000":1}`, `["\x00"]`, "U+0000"},
	} {
		t.Run(name, func(t *testing.T) {
			res, body := send(t, tc.method, w.srv.URL+tc.path, "adm", tc.body)
			require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
			require.Equal(t, problem.MediaType, res.Header.Get("Content-Type"))
			var p struct {
				Type, Detail, Field string
				Errors              []problem.FieldError
			}
			require.NoError(t, json.Unmarshal([]byte(body), &p))
			require.Equal(t, notifyapi.TypeValidation, p.Type)
			require.Equal(t, tc.field, p.Field)
			require.Equal(t, []problem.FieldError{{Field: tc.field, Message: strings.TrimPrefix(p.Detail, tc.field+" ")}}, p.Errors)
			require.Contains(t, p.Detail, tc.field+" ")
			require.Contains(t, p.Detail, tc.detail)
		})
	}
	require.Equal(t, before, stored(), "nothing was stored")

	for _, path := range []string{"/admin/parked/..", "/admin/parked/%2e%2e", "/admin/emails/" + unknown + "/../../parked"} {
		res, body := send(t, "GET", w.srv.URL+path, "adm", "")
		require.Equal(t, http.StatusNotFound, res.StatusCode, "%s: %s", path, body)
	}

	res, err := w.admin.ResolveEmail(ctx, unknown, "sent", strings.Repeat("é", adminguard.MaxReasonChars))
	require.NoError(t, err, "1024 characters fit, whatever their bytes")
	require.Equal(t, "sent", res.Email.State)
}

// TestHeldDrop: an operator lists held events and drops one for good,
// audited with the row's hashes, and its email is recorded as skipped.
func TestHeldDrop(t *testing.T) {
	t.Parallel()
	w := setup(t)
	ctx := context.Background()
	order := uuid.New()
	forged := inbox.Event{ID: uuid.New(), AggregateType: notify.AggregateType, AggregateID: order.String(), AggregateVersion: 6,
		Type: notify.TypeShipped, SchemaVersion: 1, Time: time.Now(),
		Payload: []byte(`{"order_id":"` + order.String() + `","email":"evil@evil.example","shipped_at":"2026-12-01T10:00:00Z"}`)}
	res, err := w.ib.Handle(ctx, forged)
	require.NoError(t, err)
	require.Equal(t, inbox.Held, res.Outcome)

	list, err := w.admin.Held(ctx, 0)
	require.NoError(t, err)
	require.Len(t, list.Events, 1)
	require.Equal(t, forged.ID, list.Events[0].EventID)

	_, err = w.admin.DropHeld(ctx, forged.ID, "")
	requireProblem(t, err, http.StatusBadRequest)
	hashBefore := w.rowHash(t, "SELECT sha256(convert_to(to_jsonb(h)::text, 'UTF8')) FROM inbox_held_event h WHERE event_id = $1", forged.ID)
	dropped, err := w.admin.DropHeld(ctx, forged.ID, "INC-131: forged v6")
	require.NoError(t, err)
	require.Equal(t, int64(6), dropped.AggregateVersion)
	requireAudit(t, w, "inbox_held_event/"+forged.ID.String(), "INC-131: forged v6",
		"SELECT sha256(convert_to(to_jsonb(h)::text, 'UTF8')) FROM inbox_held_event h WHERE event_id = $1", forged.ID)
	require.NotEqual(t, hashBefore, w.audit(t, "inbox_held_event/"+forged.ID.String())[0].AfterSha256)
	require.Equal(t, 1, count(t, w.pool, "SELECT count(*) FROM email_send WHERE event_id = $1 AND state = 'skipped' AND skip_reason = 'dropped'", forged.ID))

	_, err = w.admin.DropHeld(ctx, forged.ID, "again")
	requireProblem(t, err, http.StatusNotFound)
	list, err = w.admin.Held(ctx, 0)
	require.NoError(t, err)
	require.Empty(t, list.Events)
	parked, err := w.admin.Parked(ctx, notifyapi.ParkedQuery{})
	require.NoError(t, err)
	require.Len(t, parked.Events, 1)
	require.True(t, parked.Events[0].Rejected)
	require.Equal(t, "ops", parked.Events[0].RejectedBy)
}

// TestJourney (O9): the notifier's part of one event's journey, read
// after the inbox took the event: its marker, the order's inbox and
// projection versions, and the ledger row with its Message-ID. An event
// the notifier never saw answers with what there is; the order can be
// named when the event is unknown.
func TestJourney(t *testing.T) {
	t.Parallel()
	w := setup(t)
	ctx := context.Background()
	r := orderRecord(1)
	e, err := notify.DecodeRecord(r)
	require.NoError(t, err)
	_, err = w.ib.Handle(ctx, e)
	require.NoError(t, err)
	_, err = w.pool.Exec(ctx, "UPDATE email_send SET state = 'sent', sent_at = now(), smtp_reply = '250 2.0.0 queued as 7' WHERE event_id = $1", e.ID)
	require.NoError(t, err)
	orderID := uuid.MustParse(e.AggregateID)

	j, err := w.admin.Journey(ctx, e.ID, nil)
	require.NoError(t, err)
	require.Equal(t, e.ID, j.EventID)
	require.NotNil(t, j.OrderID, "the order is the one the marker names")
	require.Equal(t, orderID, *j.OrderID)
	require.NotNil(t, j.Inbox)
	require.Equal(t, "applied", j.Inbox.Outcome)
	require.Equal(t, int64(1), j.Inbox.AggregateVersion)
	require.Equal(t, notify.TypePlaced, j.Inbox.EventType)
	require.False(t, j.Inbox.ReceivedAt.IsZero())
	require.False(t, j.Inbox.ProcessedAt.Before(j.Inbox.ReceivedAt))
	require.NotNil(t, j.InboxVersion)
	require.Equal(t, int64(1), *j.InboxVersion)
	require.NotNil(t, j.Projection)
	require.Equal(t, int64(1), j.Projection.Version)
	require.Equal(t, "placed", j.Projection.Status)
	require.Equal(t, e.ID, *j.Projection.LastEventID)
	require.Len(t, j.Emails, 1)
	m := j.Emails[0]
	require.Equal(t, e.ID, m.EventID)
	require.Equal(t, notify.MessageID(e.ID), m.MessageID)
	require.Equal(t, "sent", m.State)
	require.Equal(t, "250 2.0.0 queued as 7", m.SMTPReply)
	require.Equal(t, int64(1), *m.AggregateVersion)

	// The body never carries the customer's address, subject or message.
	_, body := send(t, http.MethodGet, w.srv.URL+"/admin/events/"+e.ID.String(), "adm", "")
	require.NotContains(t, body, "alice@example.com")

	// An event the notifier never saw: no marker; with its order named,
	// the order's state and emails all the same.
	unseen := uuid.New()
	j, err = w.admin.Journey(ctx, unseen, nil)
	require.NoError(t, err)
	require.Nil(t, j.Inbox)
	require.Nil(t, j.OrderID)
	require.Empty(t, j.Emails)
	j, err = w.admin.Journey(ctx, unseen, &orderID)
	require.NoError(t, err)
	require.Nil(t, j.Inbox)
	require.Equal(t, int64(1), *j.InboxVersion)
	require.Equal(t, int64(1), j.Projection.Version)
	require.Len(t, j.Emails, 1)

	for _, path := range []string{"/admin/events/not-a-uuid", "/admin/events/" + e.ID.String() + "?order_id=x"} {
		res, body := send(t, http.MethodGet, w.srv.URL+path, "adm", "")
		require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
	}
	res, _ := send(t, http.MethodGet, w.srv.URL+"/admin/events/"+e.ID.String(), "cus", "")
	require.Equal(t, http.StatusForbidden, res.StatusCode, "a customer token reads no journey")
}
