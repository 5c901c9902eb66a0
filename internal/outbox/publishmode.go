package outbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
)

// PublishMode says which path sends the events of one type while a
// service migrates from publishing inside its transaction to the outbox
// (O7). An operator switches it per event type with Admin.SetPublishMode;
// it moves forward direct → shadow → outbox and can move back at any time.
type PublishMode string

const (
	// ModeDirect is the legacy way: the Writer's DirectPublisher sends each
	// event from inside the business transaction, before it commits. This
	// is the dual write the outbox exists to remove: a commit that fails
	// after the send leaves consumers with an event for a change that never
	// happened, and a process that dies between the send and the commit
	// does the same. It is what a service migrates away from, kept only so
	// that the migration can start from where the service is. The row is
	// still written (delivered), so that switching back later loses nothing.
	ModeDirect PublishMode = "direct"
	// ModeShadow keeps the direct path sending, and has the relay build the
	// record it would send, compare it with what the direct path logged,
	// and send nothing. Mismatches are counted in
	// outbox_shadow_compared_total and listed by Admin.ShadowReport.
	ModeShadow PublishMode = "shadow"
	// ModeOutbox is the relay alone, and the default of every event type.
	ModeOutbox PublishMode = "outbox"
)

// ParsePublishMode returns the mode named s.
func ParsePublishMode(s string) (PublishMode, error) {
	switch m := PublishMode(s); m {
	case ModeDirect, ModeShadow, ModeOutbox:
		return m, nil
	}
	return "", fmt.Errorf("%w: %q is not direct, shadow or outbox", ErrInvalidPublishMode, s)
}

// Errors of the publish-mode migration.
var (
	// ErrInvalidPublishMode means a mode other than direct, shadow and outbox.
	ErrInvalidPublishMode = errors.New("outbox: invalid publish mode")
	// ErrNoDirectPublisher means an event type is in direct or shadow mode
	// and the Writer that wrote its event has no DirectPublisher. The
	// events are written but not sent; the caller must roll back.
	ErrNoDirectPublisher = errors.New("outbox: publish mode needs a direct publisher this writer does not have")
	// ErrDirectPublish matches a failure of the DirectPublisher. The
	// broker may or may not hold the record; the caller must roll back.
	ErrDirectPublish = errors.New("outbox: direct publish failed")
)

// DirectPublisher is the "publish inside the transaction" call a service is
// migrating away from: it sends one event to the broker synchronously and
// returns the record as sent, with the partition and offset the broker
// gave it. Writer.Insert calls it, inside the business transaction, for
// each event whose type is in direct or shadow mode, and logs digests of
// the record in outbox_direct_log. createdAt is the row's created_at, the
// time the relay puts in ce_time.
//
// A DirectPublisher that returns an error fails Insert, and the caller
// rolls back; records it already sent for earlier events of the same call
// stay sent. That is the dual write, and why direct mode is a starting
// point only.
type DirectPublisher func(ctx context.Context, e Event, createdAt time.Time) (*kgo.Record, error)

// WriterOption configures a Writer.
type WriterOption func(*Writer)

// WithDirectPublisher gives the Writer the legacy path it calls for event
// types in direct or shadow mode. A Writer without one refuses such events
// with ErrNoDirectPublisher, so the mode cannot be switched away from
// outbox by mistake on a service that has no legacy path.
func WithDirectPublisher(p DirectPublisher) WriterOption {
	return func(w *Writer) { w.direct = p }
}

// sendDirect runs the direct path for the events Insert wrote in direct or
// shadow mode, in slice order, and logs what was sent, in tx.
func (w *Writer) sendDirect(ctx context.Context, tx pgx.Tx, events []Event, rows []outboxdb.OutboxInsertRow) error {
	type written struct {
		mode    PublishMode
		created time.Time
	}
	byID := make(map[uuid.UUID]written, len(rows))
	for _, r := range rows {
		byID[r.EventID] = written{PublishMode(r.PublishMode), r.CreatedAt}
	}
	var log outboxdb.DirectLogInsertParams
	for i := range events {
		e := &events[i]
		wr := byID[e.ID]
		if wr.mode != ModeDirect && wr.mode != ModeShadow {
			continue
		}
		if w.direct == nil {
			return fmt.Errorf("event type %s is in %s mode: %w", e.Type, wr.mode, ErrNoDirectPublisher)
		}
		rec, err := w.direct(ctx, *e, wr.created)
		if err != nil {
			return fmt.Errorf("%w: event %s (%s, %s mode): %w", ErrDirectPublish, e.ID, e.Type, wr.mode, err)
		}
		if rec == nil {
			return fmt.Errorf("direct publish of event %s (%s): the publisher returned no record", e.ID, e.Type)
		}
		d := digestRecord(rec)
		log.EventIDs = append(log.EventIDs, e.ID)
		log.EventTypes = append(log.EventTypes, e.Type)
		log.Modes = append(log.Modes, string(wr.mode))
		log.Topics = append(log.Topics, rec.Topic)
		log.KeySha256s = append(log.KeySha256s, d.key)
		log.ValueSha256s = append(log.ValueSha256s, d.value)
		log.Headers = append(log.Headers, d.headersJSON())
		log.Partitions = append(log.Partitions, rec.Partition)
		log.Offsets = append(log.Offsets, rec.Offset)
	}
	if len(log.EventIDs) == 0 {
		return nil
	}
	if err := outboxdb.New(tx).DirectLogInsert(ctx, log); err != nil {
		return fmt.Errorf("log %d direct sends: %w", len(log.EventIDs), err)
	}
	return nil
}

// recordDigest is what the shadow comparison looks at: the topic, and
// SHA-256 digests of the key, the value and each header. Digests rather
// than copies, so the log never holds a payload.
type recordDigest struct {
	topic      string
	key, value []byte
	headers    map[string]string // name (with #n for repeats) -> hex SHA-256
}

func digestRecord(rec *kgo.Record) recordDigest {
	k, v := sha256.Sum256(rec.Key), sha256.Sum256(canonicalJSON(rec.Value))
	d := recordDigest{topic: rec.Topic, key: k[:], value: v[:], headers: make(map[string]string, len(rec.Headers))}
	for _, h := range rec.Headers {
		name := h.Key
		for n := 2; ; n++ {
			if _, dup := d.headers[name]; !dup {
				break
			}
			name = h.Key + "#" + strconv.Itoa(n)
		}
		sum := sha256.Sum256(h.Value)
		d.headers[name] = hex.EncodeToString(sum[:])
	}
	return d
}

// canonicalJSON returns a JSON value with its object keys sorted and no
// insignificant whitespace, or b itself when it is not JSON. The relay
// sends the payload as PostgreSQL's jsonb returns it (keys reordered,
// spacing normalised), while a direct path sends the bytes it marshalled:
// the same JSON to any consumer, so the comparison must not see them as
// different.
func canonicalJSON(b []byte) []byte {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return b
	}
	out, err := json.Marshal(v)
	if err != nil {
		return b
	}
	return out
}

func (d recordDigest) headersJSON() []byte {
	b, err := json.Marshal(d.headers) // map[string]string always marshals
	if err != nil {
		panic(err)
	}
	return b
}

// perSendHeaders are left out of the comparison: the trace context is
// the sender's own, different for the direct path and the relay by design.
var perSendHeaders = map[string]bool{"traceparent": true, "tracestate": true}

// compare says how the record the relay would send differs from what the
// direct path logged; empty when they match.
func (d recordDigest) compare(logged outboxdb.DirectLogForEventsRow) string {
	var diffs []string
	if logged.Topic == nil || *logged.Topic != d.topic {
		diffs = append(diffs, "topic")
	}
	if !bytes.Equal(logged.KeySha256, d.key) {
		diffs = append(diffs, "key")
	}
	if !bytes.Equal(logged.ValueSha256, d.value) {
		diffs = append(diffs, "value")
	}
	var theirs map[string]string
	if err := json.Unmarshal(logged.Headers, &theirs); err != nil {
		diffs = append(diffs, "headers (unreadable log)")
	} else {
		names := map[string]bool{}
		for n := range d.headers {
			names[n] = true
		}
		for n := range theirs {
			names[n] = true
		}
		for _, n := range slices.Sorted(maps.Keys(names)) {
			if perSendHeaders[strings.SplitN(n, "#", 2)[0]] {
				continue
			}
			mine, ok1 := d.headers[n]
			other, ok2 := theirs[n]
			switch {
			case !ok1:
				diffs = append(diffs, "header "+n+" only sent directly")
			case !ok2:
				diffs = append(diffs, "header "+n+" missing from the direct send")
			case mine != other:
				diffs = append(diffs, "header "+n)
			}
		}
	}
	if len(diffs) == 0 {
		return ""
	}
	return "differs: " + strings.Join(diffs, ", ")
}

// Shadow comparison results, as stored in outbox_direct_log.shadow_result
// and labelled in outbox_shadow_compared_total.
const (
	ShadowMatch    = "match"
	ShadowMismatch = "mismatch"
	ShadowMissing  = "missing"
)

// shadowOutcome is the comparison of one shadow row.
type shadowOutcome struct {
	claim
	result, detail string
}

// compareShadow builds the record of every shadow row of a claim, as the
// relay would send it, and compares it with the direct path's log.
func (r *Relay) compareShadow(ctx context.Context, rows []*leased) ([]shadowOutcome, error) {
	ids := make([]uuid.UUID, len(rows))
	for i, l := range rows {
		ids[i] = l.EventID
	}
	logged, err := outboxdb.New(r.cfg.Pool).DirectLogForEvents(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("read the direct path's log of %d shadow events: %w", len(ids), err)
	}
	byID := make(map[uuid.UUID]outboxdb.DirectLogForEventsRow, len(logged))
	for _, l := range logged {
		byID[l.EventID] = l
	}
	out := make([]shadowOutcome, len(rows))
	for i, l := range rows {
		o := shadowOutcome{claim: l.claim, result: ShadowMatch}
		entry, ok := byID[l.EventID]
		switch {
		case !ok:
			o.result, o.detail = ShadowMissing, "the direct path logged no send of this event"
		default:
			if _, err := r.types.admit(l.EventType, l.SchemaVersion); err != nil {
				o.result, o.detail = ShadowMismatch, "the relay would park it: "+err.Error()
			} else if diff := digestRecord(r.buildRecord(l, l.traceparent, l.tracestate)).compare(entry); diff != "" {
				o.result, o.detail = ShadowMismatch, diff
			}
		}
		out[i] = o
	}
	return out, nil
}

// settleShadow marks compared shadow rows delivered, fenced by the lease
// token, and records each comparison. A row whose lease was lost is left
// to the relay that owns it now.
func (r *Relay) settleShadow(ctx context.Context, token uuid.UUID, outs []shadowOutcome) error {
	p := outboxdb.ShadowSettleParams{LeaseToken: token}
	for _, o := range outs {
		p.EventIDs = append(p.EventIDs, o.EventID)
		p.EventTypes = append(p.EventTypes, o.EventType)
		p.Results = append(p.Results, o.result)
		p.Details = append(p.Details, boundText(o.detail))
	}
	var ids []uuid.UUID
	err := retrySafe(ctx, func() (err error) {
		ids, err = outboxdb.New(r.cfg.Pool).ShadowSettle(ctx, p)
		return err
	})
	if err != nil {
		return fmt.Errorf("settle %d shadow events: %w", len(outs), err)
	}
	matched := make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		matched[id] = true
	}
	for i := range outs {
		o := &outs[i]
		if !matched[o.EventID] {
			continue // the lease was lost; the new owner compares it again
		}
		r.metrics.shadow.WithLabelValues(o.EventType, o.result).Inc()
		if o.result != ShadowMatch {
			r.log.WarnContext(ctx, "shadow comparison: the relay would not have sent what the direct path sent",
				"event_id", o.EventID, "event_type", o.EventType, "aggregate_id", o.AggregateID,
				"aggregate_version", o.AggregateVersion, "result", o.result, "detail", o.detail)
		}
	}
	return nil
}

// ModeSetting is one event type's publish mode.
type ModeSetting struct {
	EventType string      `json:"event_type"`
	Mode      PublishMode `json:"mode"`
	// ChangedAt and ChangedBy are zero for a type that never left outbox
	// mode, or went back to it (the audit trail keeps the history).
	ChangedAt time.Time `json:"changed_at,omitzero"`
	ChangedBy string    `json:"changed_by,omitempty"`
}

// PublishModes lists the mode of every event type the Admin's Writer knows,
// and of any other type that has a mode set.
func (a *Admin) PublishModes(ctx context.Context) ([]ModeSetting, error) {
	rows, err := outboxdb.New(a.pool).PublishModes(ctx)
	if err != nil {
		return nil, fmt.Errorf("list publish modes: %w", err)
	}
	set := make(map[string]ModeSetting, len(rows))
	for _, r := range rows {
		set[r.EventType] = ModeSetting{EventType: r.EventType, Mode: PublishMode(r.Mode), ChangedAt: r.ChangedAt, ChangedBy: r.ChangedBy}
	}
	if a.writer != nil {
		for name := range a.writer.types.byName {
			if _, ok := set[name]; !ok {
				set[name] = ModeSetting{EventType: name, Mode: ModeOutbox}
			}
		}
	}
	return slices.SortedFunc(maps.Values(set), func(x, y ModeSetting) int { return strings.Compare(x.EventType, y.EventType) }), nil
}

// SetPublishMode switches eventType to mode, audited with the actor. It
// returns the mode the type had before.
//
// Every event is sent by the path its own row names, decided by the insert
// that wrote it, so a switch never makes an event sent twice or not at
// all. Writes already in flight when the switch commits keep the mode
// they read: for a moment both paths may be sending, each its own events.
// Going back from outbox to shadow or direct keeps the table and every
// event in it; events already pending are still delivered by the relay.
func (a *Admin) SetPublishMode(ctx context.Context, actor Actor, eventType string, mode PublishMode) (PublishMode, error) {
	if err := actor.check(); err != nil {
		return "", err
	}
	if _, err := ParsePublishMode(string(mode)); err != nil {
		return "", err
	}
	if a.writer != nil {
		if _, ok := a.writer.types.byName[eventType]; !ok {
			return "", fmt.Errorf("%w: %q", ErrUnknownEventType, eventType)
		}
	}
	var before PublishMode
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		cur, err := q.PublishModeLock(ctx, eventType)
		if err != nil {
			return fmt.Errorf("read publish mode: %w", err)
		}
		before = PublishMode(cur)
		if mode == ModeOutbox {
			err = q.PublishModeClear(ctx, eventType)
		} else {
			err = q.PublishModeSet(ctx, outboxdb.PublishModeSetParams{EventType: eventType, Mode: string(mode), ChangedBy: actor.Subject})
		}
		if err != nil {
			return fmt.Errorf("set publish mode: %w", err)
		}
		detail, _ := json.Marshal(map[string]PublishMode{"from": before, "to": mode}) // cannot fail
		return writeAudit(ctx, q, actor, "publish_mode", eventType, modeHash(before), modeHash(mode), detail)
	})
	if err != nil {
		return "", fmt.Errorf("switch %s to %s mode: %w", eventType, mode, err)
	}
	return before, nil
}

// modeHash stands for a mode in the audit's before and after columns.
func modeHash(m PublishMode) []byte {
	sum := sha256.Sum256([]byte(m))
	return sum[:]
}

// ShadowCount is how many shadow events of one type compared one way.
type ShadowCount struct {
	EventType string `json:"event_type"`
	// Result is match, mismatch, missing, or pending (not compared yet).
	Result string `json:"result"`
	Count  int64  `json:"count"`
}

// ShadowDiff is one shadow event that did not match.
type ShadowDiff struct {
	EventID   uuid.UUID `json:"event_id"`
	EventType string    `json:"event_type"`
	SentAt    time.Time `json:"sent_at"`
	Result    string    `json:"result"`
	Detail    string    `json:"detail"`
}

// ShadowReport is what shadow mode found since a time: whether the relay
// would send exactly what the direct path sends. A type is ready for
// outbox mode when it has matches and no mismatch or missing event.
type ShadowReport struct {
	Since  time.Time     `json:"since"`
	Counts []ShadowCount `json:"counts"`
	Diffs  []ShadowDiff  `json:"diffs"`
}

// ShadowReport reports the shadow comparisons of events sent since since,
// of one type or all (eventType ""), with up to limit differences (50
// when zero).
func (a *Admin) ShadowReport(ctx context.Context, eventType string, since time.Time, limit int) (ShadowReport, error) {
	if limit <= 0 {
		limit = 50
	}
	var typ *string
	if eventType != "" {
		typ = &eventType
	}
	q := outboxdb.New(a.pool)
	counts, err := q.ShadowReportCounts(ctx, outboxdb.ShadowReportCountsParams{Since: since, EventType: typ})
	if err != nil {
		return ShadowReport{}, fmt.Errorf("shadow report: %w", err)
	}
	diffs, err := q.ShadowReportDiffs(ctx, outboxdb.ShadowReportDiffsParams{Since: since, EventType: typ, RowLimit: int32(limit)})
	if err != nil {
		return ShadowReport{}, fmt.Errorf("shadow report: %w", err)
	}
	rep := ShadowReport{Since: since, Counts: make([]ShadowCount, len(counts)), Diffs: make([]ShadowDiff, len(diffs))}
	for i, c := range counts {
		rep.Counts[i] = ShadowCount{EventType: c.EventType, Result: c.Result, Count: c.N}
	}
	for i, d := range diffs {
		rep.Diffs[i] = ShadowDiff{EventID: d.EventID, EventType: d.EventType, SentAt: d.SentAt, Result: d.Result, Detail: d.Detail}
	}
	return rep, nil
}
