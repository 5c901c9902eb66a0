package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/outboxref/orders/internal/outbox/cloudevents"
	"github.com/outboxref/orders/internal/outbox/internal/direct"
	"github.com/outboxref/orders/internal/outbox/internal/eventtypes"
	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxref/orders/internal/outbox/internal/w3c"
)

// MaxPayloadBytes bounds one event's payload at write time (W6). Large
// content belongs behind an immutable reference, not in the outbox.
const MaxPayloadBytes = 256 << 10

// Errors of Writer.Insert and Writer.Validate. Every refusal matches
// ErrInvalidEvent, and some also match a more specific error below; the
// *InvalidEventError behind them names the event and the field at fault.
var (
	// ErrInvalidEvent matches every event the writer refuses.
	ErrInvalidEvent = errors.New("outbox: invalid event")
	// ErrPayloadTooLarge matches a payload over MaxPayloadBytes. Unlike the
	// other refusals it is usually the request's fault, not the code's: a
	// service answers it with a 4xx (W6).
	ErrPayloadTooLarge = errors.New("outbox: event payload too large")
	// ErrUnknownEventType matches an event type the writer was not given.
	ErrUnknownEventType = errors.New("outbox: event type not registered")
	// ErrUnknownSchemaVersion matches a schema version its event type does
	// not have.
	ErrUnknownSchemaVersion = errors.New("outbox: schema version not registered")
)

// InvalidEventError is how Insert and Validate refuse an event. Use
// errors.As to read it and errors.Is with the errors above to classify it.
type InvalidEventError struct {
	// Index is the event's position in the slice given to Insert or
	// Validate.
	Index int
	// Field names the Event field at fault: "ID", "AggregateType",
	// "AggregateID", "AggregateVersion", "Type", "SchemaVersion", "Payload",
	// "Traceparent" or "Tracestate".
	Field string
	// Reason says what is wrong with it. It never quotes a payload value
	// or a text that failed its checks, so the error can be logged (O2).
	Reason string
	// eventType is the event's type when it is printable, for the message.
	eventType string
	// kind is the specific sentinel, if one applies.
	kind error
}

func (e *InvalidEventError) Error() string {
	if e.eventType != "" {
		return fmt.Sprintf("outbox: invalid event %d (%s): %s %s", e.Index, e.eventType, e.Field, e.Reason)
	}
	return fmt.Sprintf("outbox: invalid event %d: %s %s", e.Index, e.Field, e.Reason)
}

// Unwrap returns ErrInvalidEvent and, where one applies, the specific
// error (ErrPayloadTooLarge, ErrUnknownEventType, ErrUnknownSchemaVersion).
func (e *InvalidEventError) Unwrap() []error {
	if e.kind == nil {
		return []error{ErrInvalidEvent}
	}
	return []error{ErrInvalidEvent, e.kind}
}

// Writer writes events into the outbox inside the caller's transaction,
// after checking each one against the event types it was built with. It
// closes the gap a plain INSERT leaves open: an event the relay could
// never deliver (an empty type, an unknown schema version, a payload that
// breaks its contract) is refused while the caller can still roll back the
// business change, instead of being parked later, where it would block
// its aggregate for good under strict ordering (R6).
//
// A Writer is safe for concurrent use; build one at start-up and share it.
type Writer struct {
	types  *eventtypes.Set
	given  []EventType     // as given to NewWriter, for EventTypes
	direct DirectPublisher // the legacy path, for types in direct or shadow mode (O7)
	// schemaOnInsert makes Insert, Queue and QueueOneTrip check payloads
	// against their JSON Schemas too (WithSchemaCheckOnInsert).
	schemaOnInsert bool
}

// WithSchemaCheckOnInsert makes Insert, Queue and QueueOneTrip check every
// payload against its JSON Schema, as Validate always does. Without it they check
// everything else Validate checks (the type and schema version are
// registered, the size, that the payload is JSON PostgreSQL can store) but
// trust the payload's shape to the code that built it.
//
// A service that builds its payloads from typed values pins their shape in
// its own tests, which run every payload it can build through Validate (the
// orders service's TestCommandEvents); checking the same shape again on
// every insert costs about a tenth of a create's CPU and catches nothing
// those tests do not (docs/benchmarks.md). A service whose payloads come
// from input it passes through, or that has no such test, should turn the
// check on here. The consumer checks every record against the schema
// whatever the producer did, since it cannot trust the topic.
func WithSchemaCheckOnInsert() WriterOption {
	return func(w *Writer) { w.schemaOnInsert = true }
}

// NewWriter compiles the JSON Schemas of types once. It refuses what
// relay.NewRelay refuses (no types, a duplicate or unprintable name, a
// schema that does not compile), so a service can build both from one
// list.
// A service migrating from publishing inside its transaction passes
// WithDirectPublisher.
func NewWriter(types []EventType, opts ...WriterOption) (*Writer, error) {
	et, err := eventtypes.Compile(specs(types))
	if err != nil {
		return nil, fmt.Errorf("outbox writer: %w", err)
	}
	w := &Writer{types: et, given: slices.Clone(types)}
	for _, o := range opts {
		o(w)
	}
	return w, nil
}

// EventTypes returns the event types the Writer was built with, in the
// order given. The operations list the publish mode of each (O7).
func (w *Writer) EventTypes() []EventType { return slices.Clone(w.given) }

// Insert writes events inside tx, the caller's business transaction, in
// one statement, and fills in missing event IDs in place. Taking a pgx.Tx
// rather than a pool is the point: events committed on their own would be
// the dual write this package exists to prevent.
//
// An event without a Traceparent gets, in place, the W3C trace context of
// the span in ctx, if there is one (L4): the row remembers the trace that
// wrote it, and the relay continues that trace when it sends the row. A
// tracestate too long for the record header is dropped; the trace context
// never fails a write.
//
// Insert first runs Validate's checks, the JSON Schema one only with
// WithSchemaCheckOnInsert, and, if any event is refused, returns its
// *InvalidEventError without sending anything to the database: nothing is
// written and tx stays usable. The caller decides what follows; a command
// handler normally returns the error and rolls back, so the business
// change does not commit without its events.
//
// An error from the statement itself leaves tx aborted, as any failed
// statement does in PostgreSQL, and the caller must roll back. The unique
// constraint on (aggregate_type, aggregate_id, aggregate_version) is one
// such error: a second writer of the same version fails, and with it its
// whole business transaction.
//
// The same statement reads each event type's publish mode (O7). Events of
// a type in direct or shadow mode are then sent by the Writer's
// DirectPublisher, still inside tx, and logged; if that fails, or the
// Writer has none (ErrNoDirectPublisher), Insert returns the error and the
// caller must roll back. Types in outbox mode, the default, cost nothing
// more than the lookup.
func (w *Writer) Insert(ctx context.Context, tx pgx.Tx, events []Event) error {
	if len(events) == 0 {
		return nil
	}
	p, err := w.params(ctx, events)
	if err != nil {
		return err
	}
	rows, err := outboxdb.New(tx).OutboxInsert(ctx, p)
	if err != nil {
		return fmt.Errorf("insert %d outbox events: %w", len(events), err)
	}
	return w.inserted(ctx, tx, events, rows)
}

// Queue is Insert for a transaction whose statements are pipelined: it
// validates events as Insert does and adds their insert to b, which the
// caller sends with tx.SendBatch together with its own statements, so the
// business rows and the events reach the database in one round trip
// instead of one each. Once the batch has run without error, and before
// COMMIT, the caller must call the returned function: it checks what the
// insert returned and, for types in direct or shadow publish mode, sends
// as Insert does.
func (w *Writer) Queue(ctx context.Context, b *pgx.Batch, events []Event) (func(context.Context, pgx.Tx) error, error) {
	if len(events) == 0 {
		return func(context.Context, pgx.Tx) error { return nil }, nil
	}
	p, err := w.params(ctx, events)
	if err != nil {
		return nil, err
	}
	var rows []outboxdb.OutboxInsertRow
	outboxdb.QueueOutboxInsert(b, p, &rows)
	return func(ctx context.Context, tx pgx.Tx) error {
		if len(rows) != len(events) {
			return fmt.Errorf("insert %d outbox events: %d rows came back (was the batch sent?)", len(events), len(rows))
		}
		return w.inserted(ctx, tx, events, rows)
	}, nil
}

// QueueOneTrip is Queue for a batch the caller sends outside any explicit
// transaction, with pool.SendBatch or conn.SendBatch: PostgreSQL runs the
// statements of such a batch as one implicit transaction that commits when
// the batch ends, or rolls back whole when one of them fails, so a command
// costs one round trip instead of three (BEGIN, the batch, COMMIT). It
// refuses the same events as Queue, before anything is queued.
//
// A batch that commits by itself leaves no moment to send anything before
// the commit, so it cannot carry events of a type in direct or shadow
// publish mode (O7): for such a type the insert raises, nothing of the
// batch commits, and NeedsTransaction reports true for the error sending
// the batch returned. The caller then runs the command again in an explicit
// transaction with Queue or Insert, which send those events. Types in
// outbox mode, the default, never take that second path.
//
// Reading the outcome of a one-trip batch is the caller's: an error the
// database returned (a *pgconn.PgError) means nothing committed, while a
// lost connection after the batch was sent leaves the commit unknown, as
// an error of COMMIT does.
func (w *Writer) QueueOneTrip(ctx context.Context, b *pgx.Batch, events []Event) error {
	if len(events) == 0 {
		return nil
	}
	p, err := w.params(ctx, events)
	if err != nil {
		return err
	}
	p.OneRoundTrip = true
	outboxdb.QueueOutboxInsert(b, p, nil)
	return nil
}

// NeedsTransaction reports whether err, from sending a batch built with
// QueueOneTrip, is the insert's refusal of an event type in direct or
// shadow publish mode: nothing of the batch committed, and the command
// must run in an explicit transaction instead.
func NeedsTransaction(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == needsTransactionCode
}

// needsTransactionCode is the SQLSTATE outbox_needs_transaction raises
// (migration 00009): the outbox's own, so no other error is taken for it.
const needsTransactionCode = "OB001"

// params validates events, fills in their ids and trace context, and lays
// them out as the insert's arrays.
func (w *Writer) params(ctx context.Context, events []Event) (outboxdb.OutboxInsertParams, error) {
	p := outboxdb.OutboxInsertParams{}
	if err := w.validate(events, w.schemaOnInsert); err != nil {
		return p, err
	}
	traceparent, tracestate := w3c.FromContext(ctx)
	for i := range events {
		e := &events[i]
		if e.Traceparent == "" {
			e.Traceparent, e.Tracestate = traceparent, tracestate
		}
		if e.ID == uuid.Nil {
			id, err := uuid.NewV7()
			if err != nil {
				return p, fmt.Errorf("generate event id: %w", err)
			}
			e.ID = id
		}
		p.EventIDs = append(p.EventIDs, e.ID)
		p.AggregateTypes = append(p.AggregateTypes, e.AggregateType)
		p.AggregateIDs = append(p.AggregateIDs, e.AggregateID)
		p.AggregateVersions = append(p.AggregateVersions, e.AggregateVersion)
		p.EventTypes = append(p.EventTypes, e.Type)
		p.SchemaVersions = append(p.SchemaVersions, int32(e.SchemaVersion)) // bounded by eventtypes.Compile
		p.Payloads = append(p.Payloads, e.Payload)
		p.Traceparents = append(p.Traceparents, e.Traceparent)
		p.Tracestates = append(p.Tracestates, e.Tracestate)
	}
	return p, nil
}

// inserted acts on the publish modes the insert returned: a type in direct
// or shadow mode is sent now, inside the transaction (O7).
func (w *Writer) inserted(ctx context.Context, tx pgx.Tx, events []Event, rows []outboxdb.OutboxInsertRow) error {
	for _, r := range rows {
		if r.PublishMode != direct.ModeOutbox {
			return w.sendDirect(ctx, tx, events, rows)
		}
	}
	return nil
}

// Validate checks events as Insert does, without writing anything, and
// returns the first refusal as an *InvalidEventError. Insert calls it;
// tools that change rows without Insert, such as the repair of a parked
// event (O4), call it before they write.
//
// Each event must have an aggregate type and id, and a type, that the
// record headers and PostgreSQL text can carry (printable UTF-8 within the
// cloudevents bounds); an aggregate version and schema version of 1 or
// more; a type registered with the writer and a schema version that type
// has; a payload of at most MaxPayloadBytes that is JSON, storable as
// jsonb, and valid against its JSON Schema; and an empty or well-formed
// W3C traceparent, with an empty tracestate or one the record header
// carries (cloudevents.ValidTracestate). Within one call, event IDs are distinct and the events
// of one aggregate take consecutive versions in slice order (W4).
//
// Validate always checks payloads against their JSON Schemas; Insert and
// Queue do only with WithSchemaCheckOnInsert.
func (w *Writer) Validate(events []Event) error {
	return w.validate(events, true)
}

// validate runs Validate's checks, the JSON Schema one only if schema.
func (w *Writer) validate(events []Event, schema bool) error {
	type aggregate struct{ typ, id string }
	last := make(map[aggregate]int64, len(events))
	ids := make(map[uuid.UUID]bool, len(events))
	for i := range events {
		e := &events[i]
		if err := w.check(i, e, schema); err != nil {
			return err
		}
		if e.ID != uuid.Nil {
			if ids[e.ID] {
				return refuse(i, e, "ID", "appears twice in this call", nil)
			}
			ids[e.ID] = true
		}
		// Only the versions within this call can be seen here; those before
		// it are the caller's to fix from the aggregate's own version.
		agg := aggregate{e.AggregateType, e.AggregateID}
		if prev, seen := last[agg]; seen && e.AggregateVersion != prev+1 {
			return refuse(i, e, "AggregateVersion", fmt.Sprintf(
				"is %d after version %d of the same aggregate in this call; one command's events take consecutive versions (W4)",
				e.AggregateVersion, prev), nil)
		}
		last[agg] = e.AggregateVersion
	}
	return nil
}

// check validates one event on its own, against its JSON Schema too if
// schema.
func (w *Writer) check(i int, e *Event, schema bool) error {
	if err := checkText(i, e, "AggregateType", e.AggregateType, cloudevents.MaxAggregateBytes); err != nil {
		return err
	}
	if err := checkText(i, e, "AggregateID", e.AggregateID, cloudevents.MaxAggregateBytes); err != nil {
		return err
	}
	if e.AggregateVersion < 1 {
		return refuse(i, e, "AggregateVersion", fmt.Sprintf("is %d; versions of an aggregate start at 1", e.AggregateVersion), nil)
	}
	if err := checkText(i, e, "Type", e.Type, cloudevents.MaxTypeBytes); err != nil {
		return err
	}
	t, ok := w.types.Lookup(e.Type)
	if !ok {
		return refuse(i, e, "Type", "is not registered with this writer", ErrUnknownEventType)
	}
	if e.SchemaVersion < 1 {
		return refuse(i, e, "SchemaVersion", fmt.Sprintf("is %d; schema versions start at 1", e.SchemaVersion), nil)
	}
	compiled, ok := t.Schema(e.SchemaVersion)
	if !ok {
		return refuse(i, e, "SchemaVersion", fmt.Sprintf("%d is not registered for this event type", e.SchemaVersion), ErrUnknownSchemaVersion)
	}
	if e.Traceparent != "" && !cloudevents.ValidTraceparent(e.Traceparent) {
		return refuse(i, e, "Traceparent", "is not a W3C traceparent (version-traceid-parentid-flags in lower-case hex)", nil)
	}
	switch {
	case e.Tracestate == "":
	case e.Traceparent == "":
		return refuse(i, e, "Tracestate", "is set without a Traceparent", nil)
	case !cloudevents.ValidTracestate(e.Tracestate):
		return refuse(i, e, "Tracestate", fmt.Sprintf("is not printable UTF-8 of at most %d bytes", cloudevents.MaxTracestateBytes), nil)
	}
	if !schema {
		compiled = nil
	}
	return checkPayload(i, e, compiled)
}

// checkText refuses a text field that is empty, or that PostgreSQL text or
// the record headers could not carry: the consumer's cloudevents.Decode
// would refuse the record, so the event could never be delivered.
func checkText(i int, e *Event, field, value string, max int) error {
	switch {
	case value == "":
		return refuse(i, e, field, "is empty", nil)
	case !cloudevents.ValidText(value, max):
		return refuse(i, e, field, fmt.Sprintf("is not printable UTF-8 of at most %d bytes (no NUL or other control characters)", max), nil)
	}
	return nil
}

// checkPayload refuses a payload that is too large, is not JSON, cannot be
// stored as jsonb, or fails its JSON Schema (when schema is not nil). The
// size comes first, so that an oversized payload is never parsed.
func checkPayload(i int, e *Event, schema *jsonschema.Schema) error {
	switch {
	case len(e.Payload) > MaxPayloadBytes:
		return refuse(i, e, "Payload", fmt.Sprintf("is %d bytes, over the %d-byte limit; store large content elsewhere and reference it (W6)",
			len(e.Payload), MaxPayloadBytes), ErrPayloadTooLarge)
	case !utf8.Valid(e.Payload):
		return refuse(i, e, "Payload", "is not valid UTF-8", nil)
	case !json.Valid(e.Payload):
		return refuse(i, e, "Payload", "is not JSON", nil)
	}
	if reason := jsonbUnsafe(e.Payload); reason != "" {
		return refuse(i, e, "Payload", reason, nil)
	}
	if schema == nil {
		return nil
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(e.Payload))
	if err != nil {
		return refuse(i, e, "Payload", "is not JSON", nil)
	}
	if err := schema.Validate(doc); err != nil {
		return refuse(i, e, "Payload", schemaSummary(e.Type, e.SchemaVersion, err), nil)
	}
	return nil
}

// jsonbUnsafe returns why PostgreSQL would refuse valid JSON as jsonb, or
// "". jsonb stores strings as text, which cannot hold U+0000, and it
// rejects a \u escape of half a surrogate pair; either would fail the
// INSERT and abort the caller's transaction. payload must be valid JSON:
// a backslash then only occurs inside a string, and every \u has four hex
// digits.
func jsonbUnsafe(payload []byte) string {
	for i := 0; i < len(payload); i++ {
		if payload[i] != '\\' {
			continue
		}
		i++ // the escaped character; for `\\` this skips the second backslash
		if payload[i] != 'u' {
			continue
		}
		r := hex4(payload[i+1 : i+5])
		i += 4
		switch {
		case r == 0:
			return "holds \\u0000, which PostgreSQL jsonb cannot store"
		case r >= 0xDC00 && r <= 0xDFFF:
			return "holds an unpaired UTF-16 surrogate escape, which PostgreSQL jsonb refuses"
		case r >= 0xD800 && r <= 0xDBFF:
			if i+6 >= len(payload) || payload[i+1] != '\\' || payload[i+2] != 'u' {
				return "holds an unpaired UTF-16 surrogate escape, which PostgreSQL jsonb refuses"
			}
			if lo := hex4(payload[i+3 : i+7]); lo < 0xDC00 || lo > 0xDFFF {
				return "holds an unpaired UTF-16 surrogate escape, which PostgreSQL jsonb refuses"
			}
			i += 6
		}
	}
	return ""
}

// hex4 decodes four hex digits, already known to be valid.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		default:
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

func refuse(i int, e *Event, field, reason string, kind error) *InvalidEventError {
	err := &InvalidEventError{Index: i, Field: field, Reason: reason, kind: kind}
	if cloudevents.ValidText(e.Type, cloudevents.MaxTypeBytes) {
		err.eventType = e.Type
	}
	return err
}

// schemaSummary describes a JSON Schema failure by the failing locations
// and keywords, without any values: the validator's own message may quote
// the payload, which can hold personal data, and the summary is what ends
// up in errors and logs (O2).
func schemaSummary(eventType string, version int, err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return fmt.Sprintf("fails JSON Schema %s v%d", eventType, version)
	}
	var parts []string
	var walk func(*jsonschema.ValidationError)
	walk = func(v *jsonschema.ValidationError) {
		if len(v.Causes) == 0 {
			kw := "schema"
			if v.ErrorKind != nil {
				if p := v.ErrorKind.KeywordPath(); len(p) > 0 {
					kw = strings.Join(p, "/")
				}
			}
			parts = append(parts, "/"+strings.Join(v.InstanceLocation, "/")+" ("+kw+")")
			return
		}
		for _, c := range v.Causes {
			walk(c)
		}
	}
	walk(ve)
	if len(parts) > 5 {
		parts = append(parts[:5], fmt.Sprintf("and %d more", len(parts)-5))
	}
	return fmt.Sprintf("fails JSON Schema %s v%d at %s", eventType, version, strings.Join(parts, ", "))
}
