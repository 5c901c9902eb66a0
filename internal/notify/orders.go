package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/outboxref/orders/internal/inbox"
)

// OrderSnapshot is the orders API's view of an order, used to resolve a gap
// (C3).
type OrderSnapshot struct {
	ID         uuid.UUID `json:"id"`
	Email      string    `json:"email"`
	Currency   string    `json:"currency"`
	TotalCents int64     `json:"total_cents"`
	Status     string    `json:"status"`
	Version    int64     `json:"version"`
}

// OrdersClient reads orders from the orders API with the service role's
// token. It is the source of truth for resynchronisation.
type OrdersClient struct {
	baseURL string
	token   string
	http    *http.Client
}

// NewOrdersClient returns a client for the orders API at baseURL. Every
// request is bounded by timeout. Each request runs in an OpenTelemetry
// client span (global provider and propagator) and sends its traceparent,
// so the orders API's server span for a resync joins the notifier's trace
// (L4).
func NewOrdersClient(baseURL, token string, timeout time.Duration) *OrdersClient {
	return &OrdersClient{
		baseURL: strings.TrimRight(baseURL, "/"),
		token:   token,
		http:    &http.Client{Timeout: timeout, Transport: otelhttp.NewTransport(http.DefaultTransport)},
	}
}

// Fetch implements inbox.Resync's Fetch: GET /orders/{id}. A 404 becomes
// inbox.ErrNotFound, which parks the held events; any other failure is
// retried later by the inbox.
func (c *OrdersClient) Fetch(ctx context.Context, aggregateType, aggregateID string) (inbox.Snapshot, error) {
	if aggregateType != AggregateType {
		return inbox.Snapshot{}, fmt.Errorf("orders API cannot resync aggregate type %q", aggregateType)
	}
	id, err := uuid.Parse(aggregateID)
	if err != nil {
		return inbox.Snapshot{}, fmt.Errorf("%w: %q is not an order id", inbox.ErrNotFound, aggregateID)
	}
	var o OrderSnapshot
	switch err := c.get(ctx, "/orders/"+url.PathEscape(id.String()), &o); {
	case errors.Is(err, errStatusNotFound):
		return inbox.Snapshot{}, fmt.Errorf("%w: orders API answered 404 for order %s", inbox.ErrNotFound, id)
	case err != nil:
		return inbox.Snapshot{}, fmt.Errorf("GET order %s: %w", id, err)
	}
	switch {
	case o.ID != id:
		return inbox.Snapshot{}, fmt.Errorf("orders API returned order %s for %s", o.ID, id)
	case o.Version < 1:
		return inbox.Snapshot{}, fmt.Errorf("orders API returned order %s without a version", id)
	case o.Status != "placed" && o.Status != "paid" && o.Status != "shipped" && o.Status != "cancelled":
		return inbox.Snapshot{}, fmt.Errorf("orders API returned order %s with unknown status %q", id, o.Status)
	}
	// The order first, then its events: every version up to the order's is
	// in the list, which may also hold versions written in between.
	events, err := c.events(ctx, id)
	if err != nil {
		return inbox.Snapshot{}, err
	}
	return inbox.Snapshot{AggregateType: AggregateType, AggregateID: aggregateID, Version: o.Version, State: o, Events: events}, nil
}

// orderEvents is the body of GET /orders/{id}/events.
type orderEvents struct {
	OrderID uuid.UUID `json:"order_id"`
	Version int64     `json:"version"`
	Events  []struct {
		Version int64     `json:"version"`
		EventID uuid.UUID `json:"event_id"`
	} `json:"events"`
}

// events asks the orders API which event_id it wrote at each version of
// the order (C7).
func (c *OrdersClient) events(ctx context.Context, id uuid.UUID) (map[int64]uuid.UUID, error) {
	var body orderEvents
	if err := c.get(ctx, "/orders/"+url.PathEscape(id.String())+"/events", &body); err != nil {
		return nil, fmt.Errorf("GET events of order %s: %w", id, err)
	}
	if body.OrderID != id {
		return nil, fmt.Errorf("orders API returned the events of order %s for %s", body.OrderID, id)
	}
	out := make(map[int64]uuid.UUID, len(body.Events))
	for _, e := range body.Events {
		if e.Version < 1 || e.EventID == uuid.Nil {
			return nil, fmt.Errorf("orders API returned an event of order %s without a version or id", id)
		}
		if _, dup := out[e.Version]; dup {
			return nil, fmt.Errorf("orders API returned two events at version %d of order %s", e.Version, id)
		}
		out[e.Version] = e.EventID
	}
	return out, nil
}

// errStatusNotFound is get's error for a 404.
var errStatusNotFound = errors.New("orders API answered 404")

// get reads a JSON document of the orders API into v. Any status but 200
// is an error; the body of an error is not kept, since it may echo the
// request.
func (c *OrdersClient) get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.baseURL+path, nil)
	if err != nil {
		return fmt.Errorf("build orders API request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		if resp.StatusCode == http.StatusNotFound {
			return errStatusNotFound
		}
		return fmt.Errorf("orders API answered %s", resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(v); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	return nil
}
