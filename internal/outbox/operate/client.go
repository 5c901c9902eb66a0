package operate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/orders/internal/outbox/problem"
)

// The bodies of the operations' HTTP API (Admin.Handler) that are not
// already the operations' own types. The handler decodes the requests and
// encodes the answers with these types, and AdminClient sends and reads
// them, so the two ends share one definition. The other answers are the
// operations' results as they are: []Stat, []EventSummary, EventDetail,
// ReplayPlan, []ModeSetting and ShadowReport.

// RepairRequest is the body of POST /events/{id}/repair: a new payload, a
// new schema version, or both, and the reason for the audit.
type RepairRequest struct {
	Payload       json.RawMessage `json:"payload,omitempty"`
	SchemaVersion int             `json:"schema_version,omitempty"`
	Reason        string          `json:"reason"`
}

// ResumeRequest is the body of POST /events/resume: parked events by id,
// or every parked event of one type, not both.
type ResumeRequest struct {
	IDs    []uuid.UUID `json:"ids,omitempty"`
	Type   string      `json:"type,omitempty"`
	Reason string      `json:"reason"`
}

// ResumeResult is the answer of POST /events/resume: the events now
// pending again.
type ResumeResult struct {
	Resumed []uuid.UUID `json:"resumed"`
}

// PlanRequest is the body of POST /replays: the events to replay and the
// reason.
type PlanRequest struct {
	ReplaySelector
	Reason string `json:"reason"`
}

// ReasonRequest is the body of the writes that take nothing but a reason:
// POST /replays/{id}/approve and POST /replays/{id}/run.
type ReasonRequest struct {
	Reason string `json:"reason"`
}

// PublishModeRequest is the body of PUT /publish-modes/{type}.
type PublishModeRequest struct {
	Mode   PublishMode `json:"mode"`
	Reason string      `json:"reason"`
}

// PublishModeChange is the answer of PUT /publish-modes/{type}: the mode
// the type had and the one it has now.
type PublishModeChange struct {
	EventType string      `json:"event_type"`
	From      PublishMode `json:"from"`
	To        PublishMode `json:"to"`
}

// AdminClient calls the operations' HTTP API (Admin.Handler) with a bearer
// token, one method per endpoint; a service's admin CLI is a thin layer
// over it. An error answer comes back as a *problem.Problem, as the
// handler (or the service's authentication in front of it) wrote it.
type AdminClient struct {
	base  string
	token string
	http  *http.Client
}

// maxAnswerBytes bounds an answer read from the API: a plan lists its
// consumers and skipped events, an event carries a payload of at most
// MaxPayloadBytes.
const maxAnswerBytes = 16 << 20

// NewAdminClient returns a client of the operations' API at baseURL: the
// service's URL with the prefix it mounts Admin.Handler under, such as
// http://127.0.0.1:8080/admin.
func NewAdminClient(baseURL, token string) *AdminClient {
	return &AdminClient{base: strings.TrimRight(baseURL, "/"), token: token, http: &http.Client{Timeout: 30 * time.Second}}
}

// Stats returns the counts and the oldest event by type and state.
func (c *AdminClient) Stats(ctx context.Context) ([]Stat, error) {
	var out []Stat
	return out, c.do(ctx, http.MethodGet, "/stats", nil, nil, &out)
}

// Parked lists parked events matching f. f.Limit is not part of the API:
// the handler lists up to the operations' default.
func (c *AdminClient) Parked(ctx context.Context, f ParkedFilter) ([]EventSummary, error) {
	q := url.Values{}
	if f.EventType != "" {
		q.Set("type", f.EventType)
	}
	if f.AggregateID != "" {
		q.Set("aggregate", f.AggregateID)
	}
	if !f.Since.IsZero() {
		q.Set("since", f.Since.Format(time.RFC3339Nano))
	}
	var out []EventSummary
	return out, c.do(ctx, http.MethodGet, "/events/parked", q, nil, &out)
}

// Event returns one event with its payload, audit trail and replays.
func (c *AdminClient) Event(ctx context.Context, id uuid.UUID) (EventDetail, error) {
	var out EventDetail
	return out, c.do(ctx, http.MethodGet, "/events/"+id.String(), nil, nil, &out)
}

// Repair replaces the payload or schema version of a parked event.
func (c *AdminClient) Repair(ctx context.Context, id uuid.UUID, req RepairRequest) (EventDetail, error) {
	var out EventDetail
	return out, c.do(ctx, http.MethodPost, "/events/"+id.String()+"/repair", nil, req, &out)
}

// Resume puts parked events back to pending, with their event_id and
// version.
func (c *AdminClient) Resume(ctx context.Context, req ResumeRequest) (ResumeResult, error) {
	var out ResumeResult
	return out, c.do(ctx, http.MethodPost, "/events/resume", nil, req, &out)
}

// PlanReplay stores a replay plan and returns what it would do.
func (c *AdminClient) PlanReplay(ctx context.Context, req PlanRequest) (ReplayPlan, error) {
	var out ReplayPlan
	return out, c.do(ctx, http.MethodPost, "/replays", nil, req, &out)
}

// ReplayPlan returns a plan and its progress.
func (c *AdminClient) ReplayPlan(ctx context.Context, id uuid.UUID) (ReplayPlan, error) {
	var out ReplayPlan
	return out, c.do(ctx, http.MethodGet, "/replays/"+id.String(), nil, nil, &out)
}

// ApproveReplay approves a plan as a second admin.
func (c *AdminClient) ApproveReplay(ctx context.Context, id uuid.UUID, reason string) (ReplayPlan, error) {
	var out ReplayPlan
	return out, c.do(ctx, http.MethodPost, "/replays/"+id.String()+"/approve", nil, ReasonRequest{Reason: reason}, &out)
}

// RunReplay starts a plan's run, or continues an interrupted one, and
// returns at once: the run goes on in the service. ReplayPlan follows it.
func (c *AdminClient) RunReplay(ctx context.Context, id uuid.UUID, reason string) (ReplayPlan, error) {
	var out ReplayPlan
	return out, c.do(ctx, http.MethodPost, "/replays/"+id.String()+"/run", nil, ReasonRequest{Reason: reason}, &out)
}

// PublishModes lists every event type's publish mode.
func (c *AdminClient) PublishModes(ctx context.Context) ([]ModeSetting, error) {
	var out []ModeSetting
	return out, c.do(ctx, http.MethodGet, "/publish-modes", nil, nil, &out)
}

// SetPublishMode switches the publish mode of eventType.
func (c *AdminClient) SetPublishMode(ctx context.Context, eventType string, req PublishModeRequest) (PublishModeChange, error) {
	var out PublishModeChange
	return out, c.do(ctx, http.MethodPut, "/publish-modes/"+url.PathEscape(eventType), nil, req, &out)
}

// ShadowReport returns what shadow mode found for eventType (every type
// when empty) since a time (the last 24 hours when zero).
func (c *AdminClient) ShadowReport(ctx context.Context, eventType string, since time.Time) (ShadowReport, error) {
	q := url.Values{}
	if eventType != "" {
		q.Set("type", eventType)
	}
	if !since.IsZero() {
		q.Set("since", since.Format(time.RFC3339Nano))
	}
	var out ShadowReport
	return out, c.do(ctx, http.MethodGet, "/shadow-report", q, nil, &out)
}

func (c *AdminClient) do(ctx context.Context, method, path string, query url.Values, body, out any) error {
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
	if err := json.NewDecoder(io.LimitReader(res.Body, maxAnswerBytes)).Decode(out); err != nil {
		return fmt.Errorf("%s %s: read the answer: %w", method, path, err)
	}
	return nil
}
