// Package cloudevents is the Kafka record format of outbox events: the
// CloudEvents 1.0 Kafka protocol binding in binary content mode (R7). The
// outbox relay writes records with Record and consumers read them with
// Decode (the inbox wraps it), so the header names live in one place and
// the two halves cannot disagree.
//
// In binary mode the record value is the event's JSON payload itself and
// the event's attributes travel in headers; the record key is the aggregate
// id, so every event of one aggregate lands in one partition, in order.
//
// Decode treats the record as hostile input: every attribute it returns is
// checked (present, within bounds, valid UTF-8 without control characters,
// numbers in range), so that a consumer can store what it returns in a
// PostgreSQL text column without ever being refused. Anything else is
// ErrInvalid, which a consumer parks rather than retries.
package cloudevents

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Header names of the binding. The ce_ prefix is the binding's; the three
// ce_aggregate…/ce_schemaversion names are extension attributes of the
// outbox.
const (
	HeaderSpecVersion = "ce_specversion" // always "1.0"
	HeaderID          = "ce_id"          // the outbox event_id, stable across re-sends
	HeaderType        = "ce_type"        // the event type
	HeaderSource      = "ce_source"      // the producing service, a URI-reference
	HeaderSubject     = "ce_subject"     // the aggregate id, also the record key
	HeaderTime        = "ce_time"        // when the business transaction committed, RFC 3339
	HeaderContentType = "content-type"   // always "application/json"

	HeaderAggregateType    = "ce_aggregatetype"
	HeaderAggregateVersion = "ce_aggregateversion" // decimal, from 1
	HeaderSchemaVersion    = "ce_schemaversion"    // decimal, from 1

	// HeaderTraceparent and HeaderTracestate carry the W3C trace context of
	// the request that wrote the event, when it had one.
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// SpecVersion is the CloudEvents version this binding writes and accepts.
const SpecVersion = "1.0"

// Bounds on decoded attributes. They are generous for real events and keep
// a hostile record from storing megabytes in an index.
const (
	MaxIDBytes        = 36 // the canonical UUID form
	MaxTypeBytes      = 255
	MaxSourceBytes    = 1024
	MaxAggregateBytes = 1024
	// MaxTracestateBytes bounds the tracestate header. W3C allows longer
	// lists; a longer one is dropped, never the event.
	MaxTracestateBytes = 512
)

// ErrInvalid marks a record that does not follow the binding. Decoding it
// again can only fail again.
var ErrInvalid = errors.New("invalid CloudEvents record")

// Event is one event as it travels in a record.
type Event struct {
	// ID is the outbox event_id: consumers deduplicate on it.
	ID uuid.UUID
	// Type is the event type, e.g. "invoice.issued".
	Type string
	// Source names the producing service (ce_source).
	Source string
	// Time is when the business transaction committed.
	Time             time.Time
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	SchemaVersion    int
	// Traceparent and Tracestate are the W3C trace context, if any.
	Traceparent string
	Tracestate  string
	// Data is the JSON payload, the record value.
	Data []byte
}

// Record builds the Kafka record of e for topic. The key and the header
// values share one buffer: a relay builds thousands of records a second,
// and a dozen small allocations each would keep the collector busy.
func Record(topic string, e Event) *kgo.Record {
	// Enough for every value, so that the buffer is allocated once; were
	// it short, append would move on to a larger one and the values
	// already taken would keep the old one, still correct.
	size := len(SpecVersion) + MaxIDBytes + len(e.Type) + len(e.Source) + 2*len(e.AggregateID) +
		len(time.RFC3339Nano) + 6 + len(contentType) + len(e.AggregateType) + 2*20 +
		len(e.Traceparent) + len(e.Tracestate)
	buf := make([]byte, 0, size)
	h := make([]kgo.RecordHeader, 0, 12)
	start := 0
	// value cuts what was appended to buf since the last cut; its capacity
	// ends there, so nothing appended later can write into it.
	value := func() []byte {
		v := buf[start:len(buf):len(buf)]
		start = len(buf)
		return v
	}
	header := func(k string) { h = append(h, kgo.RecordHeader{Key: k, Value: value()}) }

	buf = append(buf, SpecVersion...)
	header(HeaderSpecVersion)
	buf = appendUUID(buf, e.ID)
	header(HeaderID)
	buf = append(buf, e.Type...)
	header(HeaderType)
	buf = append(buf, e.Source...)
	header(HeaderSource)
	buf = append(buf, e.AggregateID...)
	header(HeaderSubject)
	buf = e.Time.UTC().AppendFormat(buf, time.RFC3339Nano)
	header(HeaderTime)
	buf = append(buf, contentType...)
	header(HeaderContentType)
	buf = append(buf, e.AggregateType...)
	header(HeaderAggregateType)
	buf = strconv.AppendInt(buf, e.AggregateVersion, 10)
	header(HeaderAggregateVersion)
	buf = strconv.AppendInt(buf, int64(e.SchemaVersion), 10)
	header(HeaderSchemaVersion)
	if e.Traceparent != "" {
		buf = append(buf, e.Traceparent...)
		header(HeaderTraceparent)
		if e.Tracestate != "" {
			buf = append(buf, e.Tracestate...)
			header(HeaderTracestate)
		}
	}
	buf = append(buf, e.AggregateID...)
	return &kgo.Record{Topic: topic, Key: value(), Value: e.Data, Headers: h}
}

// contentType is the content-type header of every record: the value is
// the payload, JSON.
const contentType = "application/json"

// appendUUID appends the canonical form of id (8-4-4-4-12 lowercase hex
// digits) to b, as id.String() would return it.
func appendUUID(b []byte, id uuid.UUID) []byte {
	b = hex.AppendEncode(b, id[0:4])
	for _, part := range [][2]int{{4, 6}, {6, 8}, {8, 10}, {10, 16}} {
		b = append(b, '-')
		b = hex.AppendEncode(b, id[part[0]:part[1]])
	}
	return b
}

// Decode reads an event from a record written by Record (or by any producer
// of the same binding). Every error wraps ErrInvalid and says which
// attribute is wrong; values are quoted with %q so an error can be logged
// and stored safely whatever bytes the record held.
func Decode(r *kgo.Record) (Event, error) {
	h, err := headers(r)
	if err != nil {
		return Event{}, err
	}
	if v := h[HeaderSpecVersion]; v != SpecVersion {
		return Event{}, invalid("%s %q is not %s", HeaderSpecVersion, clip(v), SpecVersion)
	}
	var e Event
	id := h[HeaderID]
	if e.ID, err = uuid.Parse(id); err != nil || len(id) != MaxIDBytes || e.ID == uuid.Nil {
		return Event{}, invalid("%s %q is not a UUID", HeaderID, clip(id))
	}
	if e.Type, err = text(h, HeaderType, MaxTypeBytes); err != nil {
		return Event{}, err
	}
	if e.Source, err = text(h, HeaderSource, MaxSourceBytes); err != nil {
		return Event{}, err
	}
	if e.AggregateType, err = text(h, HeaderAggregateType, MaxAggregateBytes); err != nil {
		return Event{}, err
	}
	e.AggregateID = string(r.Key)
	subject, hasSubject := h[HeaderSubject]
	if e.AggregateID == "" {
		e.AggregateID = subject
	}
	if !ValidText(e.AggregateID, MaxAggregateBytes) || (hasSubject && subject != e.AggregateID) {
		return Event{}, invalid("record key %q and %s %q do not name one aggregate", clip(string(r.Key)), HeaderSubject, clip(subject))
	}
	v := h[HeaderAggregateVersion]
	if e.AggregateVersion, err = strconv.ParseInt(v, 10, 64); err != nil || e.AggregateVersion < 1 {
		return Event{}, invalid("%s %q is not a positive integer", HeaderAggregateVersion, clip(v))
	}
	sv := h[HeaderSchemaVersion]
	n, err := strconv.ParseInt(sv, 10, 32)
	if err != nil || n < 1 {
		return Event{}, invalid("%s %q is not a positive integer", HeaderSchemaVersion, clip(sv))
	}
	e.SchemaVersion = int(n)
	switch t, ok := h[HeaderTime]; {
	case !ok:
		e.Time = r.Timestamp
	default:
		if e.Time, err = time.Parse(time.RFC3339Nano, t); err != nil {
			return Event{}, invalid("%s %q is not RFC 3339", HeaderTime, clip(t))
		}
	}
	if ct, ok := h[HeaderContentType]; ok {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return Event{}, invalid("%s %q is not application/json", HeaderContentType, clip(ct))
		}
	}
	if !json.Valid(r.Value) {
		return Event{}, invalid("the record value is not JSON")
	}
	e.Data = r.Value
	// A malformed trace context must not cost the event: it is dropped,
	// and the event is processed without a parent span.
	if tp := h[HeaderTraceparent]; ValidTraceparent(tp) {
		e.Traceparent = tp
		if ts := h[HeaderTracestate]; ValidTracestate(ts) {
			e.Tracestate = ts
		}
	}
	return e, nil
}

var traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// ValidTraceparent reports whether s is a W3C traceparent that Decode
// keeps: version-traceid-parentid-flags in lower-case hex, version not ff.
// The outbox writer refuses any other non-empty value, so that what the
// relay sends is what the consumer reads.
func ValidTraceparent(s string) bool {
	return traceparentRE.MatchString(s) && s[:2] != "ff"
}

// ValidTracestate reports whether s is a tracestate that Decode keeps:
// printable UTF-8 of at most MaxTracestateBytes. The outbox writer refuses
// any other non-empty value, as it does for the traceparent.
func ValidTracestate(s string) bool {
	return ValidText(s, MaxTracestateBytes)
}

// headers indexes the record's headers by lower-case key. A header that
// matters repeated with different values is ambiguous, hence invalid;
// headers of other names are ignored, whatever they hold.
func headers(r *kgo.Record) (map[string]string, error) {
	h := make(map[string]string, len(r.Headers))
	for _, kv := range r.Headers {
		k := strings.ToLower(kv.Key)
		if !known[k] {
			continue
		}
		if prev, dup := h[k]; dup && prev != string(kv.Value) {
			return nil, invalid("header %s appears twice with different values", k)
		}
		h[k] = string(kv.Value)
	}
	return h, nil
}

var known = map[string]bool{
	HeaderSpecVersion: true, HeaderID: true, HeaderType: true, HeaderSource: true, HeaderSubject: true,
	HeaderTime: true, HeaderContentType: true, HeaderAggregateType: true, HeaderAggregateVersion: true,
	HeaderSchemaVersion: true, HeaderTraceparent: true, HeaderTracestate: true,
}

// text returns a required textual attribute after checking it.
func text(h map[string]string, name string, max int) (string, error) {
	v, ok := h[name]
	if !ok || v == "" {
		return "", invalid("%s is missing", name)
	}
	if !ValidText(v, max) {
		return "", invalid("%s %q is not printable UTF-8 of at most %d bytes", name, clip(v), max)
	}
	return v, nil
}

// ValidText reports whether s is non-empty, at most max bytes, valid UTF-8
// and free of control characters: what PostgreSQL text, logs and metric
// labels accept without surprises (a NUL is refused by text columns).
// Decode checks every textual attribute with it, and the outbox writer
// checks the same attributes with the same bounds before it stores them,
// so an event it accepts is one Decode accepts.
func ValidText(s string, max int) bool {
	if s == "" || len(s) > max || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// clip bounds a hostile value quoted in an error message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
