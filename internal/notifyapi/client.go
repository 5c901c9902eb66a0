package notifyapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/orders/internal/outbox/problem"
)

// Client calls the admin API with a bearer token; `notifier admin` is a
// thin layer over it. An error answer comes back as a *problem.Problem.
type Client struct {
	base  string
	token string
	http  *http.Client
}

// NewClient returns a client of the admin API at baseURL (the notifier's
// HTTP_ADDR as a URL: http://127.0.0.1:8081).
func NewClient(baseURL, token string) *Client {
	return &Client{base: strings.TrimRight(baseURL, "/"), token: token, http: &http.Client{Timeout: 30 * time.Second}}
}

// ParkedQuery selects a page of parked records.
type ParkedQuery struct {
	After int64 // the previous page's NextAfter
	Limit int   // DefaultLimit when zero
	All   bool  // resolved records too
}

// Parked lists parked records and parked held events.
func (c *Client) Parked(ctx context.Context, q ParkedQuery) (ParkedList, error) {
	v := url.Values{}
	if q.After > 0 {
		v.Set("after", strconv.FormatInt(q.After, 10))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.All {
		v.Set("all", "true")
	}
	var out ParkedList
	return out, c.do(ctx, http.MethodGet, "/admin/parked", v, nil, &out)
}

// ParkedRecord returns one parked record with its key, value and headers.
func (c *Client) ParkedRecord(ctx context.Context, id int64) (ParkedRecord, error) {
	var out ParkedRecord
	return out, c.do(ctx, http.MethodGet, "/admin/parked/"+strconv.FormatInt(id, 10), nil, nil, &out)
}

// Retry retries a parked record.
func (c *Client) Retry(ctx context.Context, id int64, reason string) (RetryResult, error) {
	var out RetryResult
	return out, c.do(ctx, http.MethodPost, "/admin/parked/"+strconv.FormatInt(id, 10)+"/retry", nil, RetryRequest{Reason: reason}, &out)
}

// Conflicts lists the inbox's conflicts.
func (c *Client) Conflicts(ctx context.Context, limit int) (ConflictList, error) {
	v := url.Values{}
	if limit > 0 {
		v.Set("limit", strconv.Itoa(limit))
	}
	var out ConflictList
	return out, c.do(ctx, http.MethodGet, "/admin/conflicts", v, nil, &out)
}

// Held lists the events waiting for an earlier version of their order.
func (c *Client) Held(ctx context.Context, limit int) (HeldList, error) {
	v := url.Values{}
	if limit > 0 {
		v.Set("limit", strconv.Itoa(limit))
	}
	var out HeldList
	return out, c.do(ctx, http.MethodGet, "/admin/held", v, nil, &out)
}

// DropHeld drops a held or parked event for good, with a reason.
func (c *Client) DropHeld(ctx context.Context, eventID uuid.UUID, reason string) (DropResult, error) {
	var out DropResult
	return out, c.do(ctx, http.MethodPost, "/admin/held/"+url.PathEscape(eventID.String())+"/drop", nil, DropRequest{Reason: reason}, &out)
}

// Emails lists send-ledger rows in state (unknown when empty).
func (c *Client) Emails(ctx context.Context, state string, limit int) (EmailList, error) {
	v := url.Values{}
	if state != "" {
		v.Set("state", state)
	}
	if limit > 0 {
		v.Set("limit", strconv.Itoa(limit))
	}
	var out EmailList
	return out, c.do(ctx, http.MethodGet, "/admin/emails", v, nil, &out)
}

// ResolveEmail resolves an unknown or failed email: sent, resend or failed.
func (c *Client) ResolveEmail(ctx context.Context, operationKey, resolution, reason string) (ResolveResult, error) {
	var out ResolveResult
	return out, c.do(ctx, http.MethodPost, "/admin/emails/"+url.PathEscape(operationKey)+"/resolve", nil,
		ResolveRequest{Resolution: resolution, Reason: reason}, &out)
}

// Journey returns the notifier's part of an event's journey. orderID may
// be nil: the order is then the one the notifier's records name.
func (c *Client) Journey(ctx context.Context, eventID uuid.UUID, orderID *uuid.UUID) (Journey, error) {
	v := url.Values{}
	if orderID != nil {
		v.Set("order_id", orderID.String())
	}
	var out Journey
	return out, c.do(ctx, http.MethodGet, "/admin/events/"+url.PathEscape(eventID.String()), v, nil, &out)
}

func (c *Client) do(ctx context.Context, method, path string, query url.Values, body, out any) error {
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer res.Body.Close()
	if res.StatusCode >= 300 {
		return problem.Read(res)
	}
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	return nil
}
