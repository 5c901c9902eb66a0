package ordersapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/orders"
	"github.com/outboxref/orders/internal/ordersapi"
	"github.com/outboxref/orders/internal/pgtest"
)

const devTokens = "dev-alice=alice:customer,dev-bob=bob:customer,dev-ops=ops:admin,dev-ops2=ops2:admin,dev-notifier=notifier:service"

type client struct {
	t      *testing.T
	srv    *httptest.Server
	pool   *pgxpool.Pool
	nudges *int
	mu     *sync.Mutex
}

type setupOpts struct {
	ready func(context.Context) error
}

func setup(t *testing.T, opts ...func(*setupOpts)) *client {
	t.Helper()
	var o setupOpts
	for _, f := range opts {
		f(&o)
	}
	db := pgtest.New(t, schema.Orders()...)
	tokens, err := auth.ParseTokens(devTokens)
	require.NoError(t, err)
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	var mu sync.Mutex
	nudges := 0
	svc, err := orders.NewService(db.Pool, orders.WithLogger(log), orders.WithNudge(func() { mu.Lock(); nudges++; mu.Unlock() }))
	require.NoError(t, err)
	ready := o.ready
	if ready == nil {
		ready = db.Pool.Ping
	}
	h := ordersapi.New(ordersapi.Config{
		Service: svc, Tokens: tokens, Log: log, Ready: ready,
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = io.WriteString(w, "# metrics\n")
		}),
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &client{t: t, srv: srv, pool: db.Pool, nudges: &nudges, mu: &mu}
}

type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.Body, &m), "body: %s", r.Body)
	return m
}

func (r response) order(t *testing.T) orders.Order {
	t.Helper()
	var o orders.Order
	require.NoError(t, json.Unmarshal(r.Body, &o), "body: %s", r.Body)
	return o
}

// do sends a request and checks the response against docs/openapi.yaml.
// headers alternate name, value.
func (c *client) do(method, path, token string, body any, headers ...string) response {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		require.NoError(c.t, err)
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, c.srv.URL+path, rd)
	require.NoError(c.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := c.srv.Client().Do(req)
	require.NoError(c.t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(c.t, err)
	checkContract(c.t, req, res, b)
	if res.StatusCode >= 400 && path != "/readyz" { // readiness reports its checks as plain JSON
		require.Equal(c.t, "application/problem+json", res.Header.Get("Content-Type"), "errors are RFC 9457 problems: %s", b)
	}
	return response{Status: res.StatusCode, Header: res.Header, Body: b}
}

func orderBody(opts ...func(map[string]any)) map[string]any {
	b := map[string]any{
		"email":    "alice@example.com",
		"currency": "EUR",
		"items":    []any{map[string]any{"sku": "BOOK-1", "quantity": 2, "unit_price_cents": 1250}},
	}
	for _, o := range opts {
		o(b)
	}
	return b
}

func (c *client) create(token string) orders.Order {
	c.t.Helper()
	r := c.do("POST", "/orders", token, orderBody())
	require.Equal(c.t, http.StatusCreated, r.Status, "%s", r.Body)
	return r.order(c.t)
}

func (c *client) outboxVersions(id string) []string {
	c.t.Helper()
	rows, err := c.pool.Query(context.Background(), "SELECT event_type || ':' || aggregate_version FROM outbox WHERE aggregate_id = $1 ORDER BY aggregate_version", id)
	require.NoError(c.t, err)
	out, err := collectStrings(rows)
	require.NoError(c.t, err)
	return out
}

func collectStrings(rows interface {
	Next() bool
	Scan(...any) error
	Err() error
	Close()
}) ([]string, error) {
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

func TestCreateAndRead(t *testing.T) {
	t.Parallel()
	c := setup(t)

	r := c.do("POST", "/orders", "dev-alice", orderBody())
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, `"1"`, r.Header.Get("ETag"))
	o := r.order(t)
	require.Equal(t, "/orders/"+o.ID.String(), r.Header.Get("Location"))
	require.Equal(t, "alice", o.Customer)
	require.Equal(t, orders.StatusPlaced, o.Status)
	require.EqualValues(t, 1, o.Version)
	require.EqualValues(t, 2500, o.TotalCents)
	require.Len(t, o.Items, 1)
	require.Equal(t, []string{"order.placed:1"}, c.outboxVersions(o.ID.String()))
	c.mu.Lock()
	require.Equal(t, 1, *c.nudges, "a commit that recorded events nudges the relay")
	c.mu.Unlock()

	r = c.do("GET", "/orders/"+o.ID.String(), "dev-alice", nil)
	require.Equal(t, http.StatusOK, r.Status)
	require.Equal(t, `"1"`, r.Header.Get("ETag"))
	require.Equal(t, o, r.order(t))

	t.Run("OthersSeeNotFound", func(t *testing.T) {
		require.Equal(t, http.StatusNotFound, c.do("GET", "/orders/"+o.ID.String(), "dev-bob", nil).Status)
	})
	t.Run("AdminAndServiceReadAny", func(t *testing.T) {
		require.Equal(t, http.StatusOK, c.do("GET", "/orders/"+o.ID.String(), "dev-ops", nil).Status)
		require.Equal(t, http.StatusOK, c.do("GET", "/orders/"+o.ID.String(), "dev-notifier", nil).Status)
	})
	t.Run("UnknownAndMalformedIDs", func(t *testing.T) {
		require.Equal(t, http.StatusNotFound, c.do("GET", "/orders/00000000-0000-0000-0000-000000000001", "dev-alice", nil).Status)
		require.Equal(t, http.StatusNotFound, c.do("GET", "/orders/not-a-uuid", "dev-alice", nil).Status)
	})
	t.Run("ServiceCannotCreate", func(t *testing.T) {
		require.Equal(t, http.StatusForbidden, c.do("POST", "/orders", "dev-notifier", orderBody()).Status)
	})
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	c := setup(t)
	for _, tc := range []struct{ name, method, path, token string }{
		{"NoTokenCreate", "POST", "/orders", ""},
		{"NoTokenList", "GET", "/orders", ""},
		{"NoTokenGet", "GET", "/orders/00000000-0000-0000-0000-000000000001", ""},
		{"UnknownToken", "GET", "/orders", "nope"},
		{"NoTokenPay", "POST", "/orders/00000000-0000-0000-0000-000000000001/pay", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := c.do(tc.method, tc.path, tc.token, nil)
			require.Equal(t, http.StatusUnauthorized, r.Status)
			require.Equal(t, `Bearer realm="orders"`, r.Header.Get("WWW-Authenticate"))
		})
	}
	t.Run("OpenEndpoints", func(t *testing.T) {
		require.Equal(t, http.StatusOK, c.do("GET", "/healthz", "", nil).Status)
		require.Equal(t, http.StatusOK, c.do("GET", "/readyz", "", nil).Status)
		require.Equal(t, http.StatusOK, c.do("GET", "/metrics", "", nil).Status)
	})
}

func TestReadinessReflectsDatabaseOnly(t *testing.T) {
	t.Parallel()
	c := setup(t, func(o *setupOpts) {
		o.ready = func(context.Context) error { return errors.New("database down") }
	})
	r := c.do("GET", "/readyz", "", nil)
	require.Equal(t, http.StatusServiceUnavailable, r.Status)
	require.Equal(t, "unavailable", r.json(t)["database"])
	require.Equal(t, http.StatusOK, c.do("GET", "/healthz", "", nil).Status, "liveness does not depend on the database")
}

func TestCommands(t *testing.T) {
	t.Parallel()
	c := setup(t)
	o := c.create("dev-alice")
	path := "/orders/" + o.ID.String()

	t.Run("MissingIfMatch", func(t *testing.T) {
		r := c.do("POST", path+"/pay", "dev-alice", nil)
		require.Equal(t, http.StatusPreconditionRequired, r.Status)
	})
	t.Run("MalformedIfMatch", func(t *testing.T) {
		for _, v := range []string{"1", `W/"1"`, `"abc"`, `"0"`, "*"} {
			r := c.do("POST", path+"/pay", "dev-alice", nil, "If-Match", v)
			require.Equal(t, http.StatusBadRequest, r.Status, "If-Match %s", v)
		}
	})
	t.Run("OtherCustomer", func(t *testing.T) {
		require.Equal(t, http.StatusNotFound, c.do("POST", path+"/pay", "dev-bob", nil, "If-Match", `"1"`).Status)
	})
	t.Run("ServiceRoleIsReadOnly", func(t *testing.T) {
		require.Equal(t, http.StatusForbidden, c.do("POST", path+"/pay", "dev-notifier", nil, "If-Match", `"1"`).Status)
	})
	t.Run("ShipIsAdminOnly", func(t *testing.T) {
		require.Equal(t, http.StatusForbidden, c.do("POST", path+"/ship", "dev-alice", nil, "If-Match", `"1"`).Status)
	})
	t.Run("IllegalTransition", func(t *testing.T) {
		r := c.do("POST", path+"/ship", "dev-ops", nil, "If-Match", `"1"`)
		require.Equal(t, http.StatusConflict, r.Status)
		require.Contains(t, r.json(t)["detail"], "placed")
	})

	r := c.do("POST", path+"/pay", "dev-alice", nil, "If-Match", `"1"`)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	require.Equal(t, `"2"`, r.Header.Get("ETag"))
	require.Equal(t, orders.StatusPaid, r.order(t).Status)

	r = c.do("POST", path+"/pay", "dev-alice", nil, "If-Match", `"1"`)
	require.Equal(t, http.StatusPreconditionFailed, r.Status)
	require.EqualValues(t, 2, r.json(t)["current_version"])

	r = c.do("POST", path+"/pay", "dev-alice", nil, "If-Match", `"2"`)
	require.Equal(t, http.StatusConflict, r.Status, "paying twice is an illegal transition")

	r = c.do("POST", path+"/ship", "dev-ops", nil, "If-Match", `"2"`)
	require.Equal(t, http.StatusOK, r.Status)
	require.Equal(t, `"3"`, r.Header.Get("ETag"))
	r = c.do("POST", path+"/cancel", "dev-alice", nil, "If-Match", `"3"`)
	require.Equal(t, http.StatusConflict, r.Status, "a shipped order cannot be cancelled")
	require.Equal(t, []string{"order.placed:1", "order.paid:2", "order.shipped:3"}, c.outboxVersions(o.ID.String()))

	t.Run("CancelPlaced", func(t *testing.T) {
		o := c.create("dev-alice")
		r := c.do("POST", "/orders/"+o.ID.String()+"/cancel", "dev-alice", nil, "If-Match", `"1"`)
		require.Equal(t, http.StatusOK, r.Status)
		require.Equal(t, `"2"`, r.Header.Get("ETag"))
		require.Equal(t, []string{"order.placed:1", "order.cancelled:2"}, c.outboxVersions(o.ID.String()))
	})
	t.Run("CancelPaidRequestsRefund", func(t *testing.T) {
		o := c.create("dev-alice")
		p := "/orders/" + o.ID.String()
		require.Equal(t, http.StatusOK, c.do("POST", p+"/pay", "dev-alice", nil, "If-Match", `"1"`).Status)
		r := c.do("POST", p+"/cancel", "dev-alice", nil, "If-Match", `"2"`)
		require.Equal(t, http.StatusOK, r.Status)
		require.Equal(t, `"4"`, r.Header.Get("ETag"))
		require.Equal(t, orders.StatusCancelled, r.order(t).Status)
		require.Equal(t, []string{"order.placed:1", "order.paid:2", "order.cancelled:3", "order.refund_requested:4"}, c.outboxVersions(o.ID.String()))
	})
}

// TestConcurrentPay: twenty clients pay with the same If-Match; the
// conditional update lets exactly one win.
func TestConcurrentPay(t *testing.T) {
	t.Parallel()
	c := setup(t)
	o := c.create("dev-alice")
	const n = 20
	statuses := make(chan int, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req, _ := http.NewRequest("POST", c.srv.URL+"/orders/"+o.ID.String()+"/pay", nil)
			req.Header.Set("Authorization", "Bearer dev-alice")
			req.Header.Set("If-Match", `"1"`)
			res, err := c.srv.Client().Do(req)
			if err != nil {
				statuses <- -1
				return
			}
			res.Body.Close()
			statuses <- res.StatusCode
		}()
	}
	close(start)
	wg.Wait()
	close(statuses)
	count := map[int]int{}
	for s := range statuses {
		count[s]++
	}
	require.Equal(t, map[int]int{http.StatusOK: 1, http.StatusPreconditionFailed: n - 1}, count)
	require.Equal(t, []string{"order.placed:1", "order.paid:2"}, c.outboxVersions(o.ID.String()))
}

func TestInputValidation(t *testing.T) {
	t.Parallel()
	c := setup(t)

	t.Run("MalformedJSON", func(t *testing.T) {
		r := c.do("POST", "/orders", "dev-alice", `{"email":`)
		require.Equal(t, http.StatusBadRequest, r.Status)
	})
	t.Run("WrongType", func(t *testing.T) {
		r := c.do("POST", "/orders", "dev-alice", `{"email":"a@b.c","currency":"EUR","items":[{"sku":"X","quantity":"two","unit_price_cents":1}]}`)
		require.Equal(t, http.StatusBadRequest, r.Status)
		require.Contains(t, string(r.Body), "quantity")
	})
	t.Run("UnknownField", func(t *testing.T) {
		r := c.do("POST", "/orders", "dev-alice", orderBody(func(b map[string]any) { b["discount"] = 100 }))
		require.Equal(t, http.StatusBadRequest, r.Status)
		require.Contains(t, string(r.Body), "discount")
	})
	t.Run("TrailingData", func(t *testing.T) {
		b, _ := json.Marshal(orderBody())
		r := c.do("POST", "/orders", "dev-alice", string(b)+" {}")
		require.Equal(t, http.StatusBadRequest, r.Status)
	})
	t.Run("InvalidUTF8", func(t *testing.T) {
		// JSON is UTF-8. A decoder would quietly turn the bad byte into
		// U+FFFD, and an address the customer never typed would be stored
		// and mailed; the body is refused instead.
		r := c.do("POST", "/orders", "dev-alice", "{\"email\":\"al\xffce@example.com\",\"currency\":\"EUR\",\"items\":[{\"sku\":\"X\",\"quantity\":1,\"unit_price_cents\":1}]}")
		require.Equal(t, http.StatusBadRequest, r.Status)
		require.Contains(t, string(r.Body), "UTF-8")
	})
	t.Run("FieldsNamed", func(t *testing.T) {
		r := c.do("POST", "/orders", "dev-alice", map[string]any{
			"email": "not-an-email", "currency": "eur",
			"items": []any{map[string]any{"sku": "", "quantity": 0, "unit_price_cents": -1}},
		})
		require.Equal(t, http.StatusUnprocessableEntity, r.Status)
		var p struct {
			Errors []orders.FieldError `json:"errors"`
		}
		require.NoError(t, json.Unmarshal(r.Body, &p))
		var fields []string
		for _, e := range p.Errors {
			fields = append(fields, e.Field)
		}
		require.ElementsMatch(t, []string{"email", "currency", "items[0].sku", "items[0].quantity", "items[0].unit_price_cents"}, fields)
	})
	t.Run("TooManyLines", func(t *testing.T) {
		items := make([]any, orders.MaxLines+1)
		for i := range items {
			items[i] = map[string]any{"sku": fmt.Sprintf("S-%d", i), "quantity": 1, "unit_price_cents": 1}
		}
		r := c.do("POST", "/orders", "dev-alice", orderBody(func(b map[string]any) { b["items"] = items }))
		require.Equal(t, http.StatusUnprocessableEntity, r.Status)
		require.Contains(t, string(r.Body), `"items"`)
	})
	t.Run("MaxLinesAccepted", func(t *testing.T) {
		items := make([]any, orders.MaxLines)
		for i := range items {
			items[i] = map[string]any{"sku": fmt.Sprintf("S-%d", i), "quantity": 1, "unit_price_cents": 1}
		}
		r := c.do("POST", "/orders", "dev-alice", orderBody(func(b map[string]any) { b["items"] = items }))
		require.Equal(t, http.StatusCreated, r.Status)
	})
	t.Run("BodyTooLarge", func(t *testing.T) {
		big := `{"email":"alice@example.com","currency":"EUR","items":[{"sku":"` + strings.Repeat("x", ordersapi.MaxBodyBytes) + `","quantity":1,"unit_price_cents":1}]}`
		r := c.do("POST", "/orders", "dev-alice", big)
		require.Equal(t, http.StatusRequestEntityTooLarge, r.Status)
	})
	var n int
	require.NoError(t, c.pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox").Scan(&n))
	require.Equal(t, 1, n, "rejected requests write nothing")
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	c := setup(t)
	r1 := c.do("POST", "/orders", "dev-alice", orderBody(), "Idempotency-Key", "checkout-42")
	require.Equal(t, http.StatusCreated, r1.Status)
	r2 := c.do("POST", "/orders", "dev-alice", orderBody(), "Idempotency-Key", "checkout-42")
	require.Equal(t, http.StatusCreated, r2.Status)
	require.Equal(t, "true", r2.Header.Get("Idempotent-Replayed"))
	require.Equal(t, r1.order(t), r2.order(t))

	r3 := c.do("POST", "/orders", "dev-alice", orderBody(func(b map[string]any) { b["currency"] = "USD" }), "Idempotency-Key", "checkout-42")
	require.Equal(t, http.StatusUnprocessableEntity, r3.Status)

	r4 := c.do("POST", "/orders", "dev-alice", orderBody(), "Idempotency-Key", "bad key with spaces")
	require.Equal(t, http.StatusUnprocessableEntity, r4.Status)

	var orderCount, eventCount int
	require.NoError(t, c.pool.QueryRow(context.Background(), "SELECT count(*) FROM orders").Scan(&orderCount))
	require.NoError(t, c.pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox").Scan(&eventCount))
	require.Equal(t, 1, orderCount)
	require.Equal(t, 1, eventCount)
}

func TestList(t *testing.T) {
	t.Parallel()
	c := setup(t)
	var created []string
	for range 5 {
		created = append(created, c.create("dev-alice").ID.String())
	}
	c.create("dev-bob")

	var got []string
	cursor := ""
	for page := 0; ; page++ {
		require.Less(t, page, 5, "pagination must end")
		path := "/orders?limit=2"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		r := c.do("GET", path, "dev-alice", nil)
		require.Equal(t, http.StatusOK, r.Status)
		var l struct {
			Items      []orders.Order `json:"items"`
			NextCursor string         `json:"next_cursor"`
		}
		require.NoError(t, json.Unmarshal(r.Body, &l))
		require.LessOrEqual(t, len(l.Items), 2)
		for _, o := range l.Items {
			require.Equal(t, "alice", o.Customer)
			got = append(got, o.ID.String())
		}
		if l.NextCursor == "" {
			break
		}
		cursor = l.NextCursor
	}
	want := make([]string, len(created))
	for i, id := range created {
		want[len(created)-1-i] = id
	}
	require.Equal(t, want, got, "newest first, every order once")

	t.Run("BadParameters", func(t *testing.T) {
		for _, q := range []string{"limit=0", "limit=101", "limit=x", "cursor=garbage"} {
			require.Equal(t, http.StatusBadRequest, c.do("GET", "/orders?"+q, "dev-alice", nil).Status, q)
		}
	})
	t.Run("EmptyForOthers", func(t *testing.T) {
		r := c.do("GET", "/orders", "dev-ops", nil)
		require.Equal(t, http.StatusOK, r.Status)
		require.Equal(t, []any{}, r.json(t)["items"])
	})
}

// TestOrderEvents: GET /orders/{id}/events names the event the outbox
// wrote at each version, still in the outbox or archived by the cleanup,
// to the callers that may read the order (C7).
func TestOrderEvents(t *testing.T) {
	t.Parallel()
	c := setup(t)
	o := c.create("dev-alice")
	path := "/orders/" + o.ID.String()
	require.Equal(t, http.StatusOK, c.do("POST", path+"/pay", "dev-alice", nil, "If-Match", `"1"`).Status)
	// The cleanup moved v1 to the archive: its identity is still the answer.
	_, err := c.pool.Exec(context.Background(), `
		WITH moved AS (DELETE FROM outbox WHERE aggregate_id = $1 AND aggregate_version = 1 RETURNING *)
		INSERT INTO outbox_archive (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, created_at)
		SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, created_at FROM moved`, o.ID.String())
	require.NoError(t, err)

	want := map[int64]string{}
	rows, err := c.pool.Query(context.Background(), `SELECT aggregate_version, event_id::text FROM outbox WHERE aggregate_id = $1
		UNION ALL SELECT aggregate_version, event_id::text FROM outbox_archive WHERE aggregate_id = $1`, o.ID.String())
	require.NoError(t, err)
	for rows.Next() {
		var v int64
		var id string
		require.NoError(t, rows.Scan(&v, &id))
		want[v] = id
	}
	require.NoError(t, rows.Err())
	require.Len(t, want, 2)

	for _, token := range []string{"dev-notifier", "dev-alice", "dev-ops"} {
		r := c.do("GET", path+"/events", token, nil)
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", token, r.Body)
		var body struct {
			OrderID string `json:"order_id"`
			Version int64  `json:"version"`
			Events  []struct {
				Version   int64  `json:"version"`
				EventID   string `json:"event_id"`
				EventType string `json:"event_type"`
			} `json:"events"`
		}
		require.NoError(t, json.Unmarshal(r.Body, &body))
		require.Equal(t, o.ID.String(), body.OrderID)
		require.Equal(t, int64(2), body.Version)
		got := map[int64]string{}
		for _, e := range body.Events {
			got[e.Version] = e.EventID
		}
		require.Equal(t, want, got)
		require.Equal(t, "order.placed", body.Events[0].EventType)
	}
	require.Equal(t, http.StatusNotFound, c.do("GET", path+"/events", "dev-bob", nil).Status, "not Bob's order")
	require.Equal(t, http.StatusUnauthorized, c.do("GET", path+"/events", "", nil).Status)
	require.Equal(t, http.StatusNotFound, c.do("GET", "/orders/00000000-0000-0000-0000-000000000001/events", "dev-notifier", nil).Status)
}
