// Command bareapi is a reference of cmd/bench's api scenario: the least
// an HTTP service written in Go with net/http and pgx must do for
// POST /orders, and nothing else. It checks the bearer token, decodes the
// body and checks it as the service does (orders.CreateInput), makes the order's and the event's UUIDv7, builds the
// order.placed payload, sends the order, its lines and its outbox row in
// one round trip (a pgx.Batch outside an explicit transaction, as the
// orders service does) from a pool of 16 connections, and answers 201
// with the order. It has no router, idempotency keys, logs, metrics,
// traces, schema checks or relay.
//
// Between the service and pgbench, it tells what the service's own
// machinery costs from what serving HTTP from Go at all costs.
//
//	BAREAPI_ADDR=127.0.0.1:8080 DATABASE_URL=postgres://... BAREAPI_TOKEN=t bareapi
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	pgxuuid "github.com/vgarvardt/pgx-google-uuid/v5"

	"github.com/outboxref/orders/internal/orders"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv("BAREAPI_ADDR"), os.Getenv("DATABASE_URL"), os.Getenv("BAREAPI_TOKEN")); err != nil {
		fmt.Fprintln(os.Stderr, "bareapi:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, addr, url, token string) error {
	if addr == "" || url == "" || token == "" {
		return errors.New("BAREAPI_ADDR, DATABASE_URL and BAREAPI_TOKEN must be set")
	}
	pool, err := openPool(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	srv := &http.Server{Addr: addr, Handler: newHandler(pool, token), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	}
}

// openPool opens a pool set up as the orders service's: 16 connections,
// uuid.UUID sent as its 16 bytes.
func openPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 16
	cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		pgxuuid.Register(conn.TypeMap())
		return nil
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// The order, its lines and its event: the columns the service writes.
const (
	insertOrder = `INSERT INTO orders (id, customer, email, currency, status, total_cents, version, created_at, updated_at)
VALUES ($1, $2, $3, $4, 'placed', $5, 1, $6, $6)`
	insertLines = `INSERT INTO order_lines (order_id, line_no, sku, quantity, unit_price_cents)
SELECT $1, unnest($2::integer[]), unnest($3::text[]), unnest($4::integer[]), unnest($5::bigint[])`
	insertEvent = `INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
VALUES ($1, 'order', $2, 1, 'order.placed', 1, $3)`
)

type item struct {
	SKU            string `json:"sku"`
	Quantity       int32  `json:"quantity"`
	UnitPriceCents int64  `json:"unit_price_cents"`
}

type order struct {
	ID         uuid.UUID `json:"id"`
	Customer   string    `json:"customer"`
	Email      string    `json:"email"`
	Currency   string    `json:"currency"`
	Status     string    `json:"status"`
	Items      []item    `json:"items"`
	TotalCents int64     `json:"total_cents"`
	Version    int       `json:"version"`
	PlacedAt   time.Time `json:"placed_at"`
}

// placed is the order.placed payload, schema version 1.
type placed struct {
	OrderID    uuid.UUID `json:"order_id"`
	Customer   string    `json:"customer"`
	Email      string    `json:"email"`
	Currency   string    `json:"currency"`
	Items      []item    `json:"items"`
	TotalCents int64     `json:"total_cents"`
	PlacedAt   time.Time `json:"placed_at"`
}

func newHandler(pool *pgxpool.Pool, token string) http.Handler {
	want := "Bearer " + token
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != want {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		// A bounded body of valid UTF-8 (JSON's encoding), as the service reads it.
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
		var in orders.CreateInput
		if err != nil || !utf8.Valid(body) || json.Unmarshal(body, &in) != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		// The service's own check of the input: what any create must check.
		if err := in.Validate(); err != nil {
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		}
		o, err := place(r.Context(), pool, "bench", in)
		if err != nil {
			http.Error(w, "database error", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(o)
	})
	return mux
}

// place writes the order, its lines and its event in one round trip. in
// has passed Validate, which bounds every number.
func place(ctx context.Context, pool *pgxpool.Pool, customer string, in orders.CreateInput) (order, error) {
	o := order{Customer: customer, Email: in.Email, Currency: in.Currency, Status: "placed", Version: 1,
		PlacedAt: time.Now().UTC()}
	n := len(in.Items)
	o.Items = make([]item, n)
	lines, skus, qty, prices := make([]int32, n), make([]string, n), make([]int32, n), make([]int64, n)
	for i, it := range in.Items {
		o.Items[i] = item{SKU: it.SKU, Quantity: int32(*it.Quantity), UnitPriceCents: *it.UnitPriceCents} // bounded by Validate
		lines[i], skus[i], qty[i], prices[i] = int32(i+1), it.SKU, int32(*it.Quantity), *it.UnitPriceCents
		o.TotalCents += *it.Quantity * *it.UnitPriceCents
	}
	var err error
	if o.ID, err = uuid.NewV7(); err != nil {
		return order{}, err
	}
	eventID, err := uuid.NewV7()
	if err != nil {
		return order{}, err
	}
	payload, err := json.Marshal(placed{OrderID: o.ID, Customer: customer, Email: o.Email, Currency: o.Currency,
		Items: o.Items, TotalCents: o.TotalCents, PlacedAt: o.PlacedAt})
	if err != nil {
		return order{}, err
	}
	b := &pgx.Batch{}
	b.Queue(insertOrder, o.ID, customer, o.Email, o.Currency, o.TotalCents, o.PlacedAt)
	b.Queue(insertLines, o.ID, lines, skus, qty, prices)
	b.Queue(insertEvent, eventID, o.ID.String(), payload)
	// Outside an explicit transaction the batch is one implicit
	// transaction, committed when it ends.
	return o, pool.SendBatch(ctx, b).Close()
}
