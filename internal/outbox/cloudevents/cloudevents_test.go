package cloudevents_test

import (
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

func sample() cloudevents.Event {
	return cloudevents.Event{
		ID: uuid.New(), Type: "invoice.issued", Source: "urn:example:invoices",
		Time:          time.Date(2026, 5, 1, 12, 30, 0, 123456789, time.UTC),
		AggregateType: "invoice", AggregateID: "inv-42", AggregateVersion: 3, SchemaVersion: 2,
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Tracestate: "vendor=1",
		Data: []byte(`{"total_cents":1200}`),
	}
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	e := sample()
	r := cloudevents.Record("invoices.events", e)
	require.Equal(t, "invoices.events", r.Topic)
	require.Equal(t, []byte("inv-42"), r.Key, "the key is the aggregate id: one aggregate, one partition")
	got, err := cloudevents.Decode(r)
	require.NoError(t, err)
	require.Equal(t, e, got)
}

// TestRecordHeaders pins the bytes Record writes. The values share one
// buffer, so the test also appends to each value and checks that no other
// value, nor the key, changed.
func TestRecordHeaders(t *testing.T) {
	t.Parallel()
	for _, e := range []cloudevents.Event{sample(), func() cloudevents.Event {
		e := sample()
		e.ID = uuid.MustParse("00ff10ab-c3d4-4e5f-8a9b-0c1d2e3f4a5b")
		e.Time = time.Date(2026, 5, 1, 14, 30, 0, 0, time.FixedZone("CEST", 2*3600))
		e.Traceparent, e.Tracestate = "", "ignored without a traceparent"
		e.AggregateVersion, e.SchemaVersion = 1<<62, 1
		return e
	}()} {
		r := cloudevents.Record("invoices.events", e)
		want := [][2]string{
			{"ce_specversion", "1.0"},
			{"ce_id", e.ID.String()},
			{"ce_type", e.Type},
			{"ce_source", e.Source},
			{"ce_subject", e.AggregateID},
			{"ce_time", e.Time.UTC().Format(time.RFC3339Nano)},
			{"content-type", "application/json"},
			{"ce_aggregatetype", e.AggregateType},
			{"ce_aggregateversion", strconv.FormatInt(e.AggregateVersion, 10)},
			{"ce_schemaversion", strconv.Itoa(e.SchemaVersion)},
		}
		if e.Traceparent != "" {
			want = append(want, [2]string{"traceparent", e.Traceparent}, [2]string{"tracestate", e.Tracestate})
		}
		got := func() [][2]string {
			var out [][2]string
			for _, h := range r.Headers {
				out = append(out, [2]string{h.Key, string(h.Value)})
			}
			return out
		}
		require.Equal(t, want, got())
		for i := range r.Headers {
			_ = append(r.Headers[i].Value, "XXXXXXXX"...)
		}
		_ = append(r.Key, "XXXXXXXX"...)
		require.Equal(t, want, got(), "appending to one value wrote into another")
		require.Equal(t, e.AggregateID, string(r.Key))
	}
}

// TestDecodeRefuses lists hostile records; each is ErrInvalid, never a
// panic and never an event carrying bytes a text column would refuse.
func TestDecodeRefuses(t *testing.T) {
	t.Parallel()
	set := func(key, value string) func(*kgo.Record) {
		return func(r *kgo.Record) {
			for i := range r.Headers {
				if r.Headers[i].Key == key {
					r.Headers[i].Value = []byte(value)
					return
				}
			}
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
		}
	}
	for name, mod := range map[string]func(*kgo.Record){
		"NULInType":              set(cloudevents.HeaderType, "order.paid\x00"),
		"NULInID":                set(cloudevents.HeaderID, "\x00"+uuid.NewString()[1:]),
		"InvalidUTF8InID":        set(cloudevents.HeaderID, "\xff"+uuid.NewString()[1:]),
		"NilID":                  set(cloudevents.HeaderID, uuid.Nil.String()),
		"BracedID":               set(cloudevents.HeaderID, "{"+uuid.NewString()+"}"),
		"ControlInAggregateType": set(cloudevents.HeaderAggregateType, "in\nvoice"),
		"LongType":               set(cloudevents.HeaderType, strings.Repeat("t", cloudevents.MaxTypeBytes+1)),
		"MissingSource":          set(cloudevents.HeaderSource, ""),
		"SpecVersion":            set(cloudevents.HeaderSpecVersion, "0.3"),
		"SubjectMismatch":        set(cloudevents.HeaderSubject, "inv-43"),
		"ZeroVersion":            set(cloudevents.HeaderAggregateVersion, "0"),
		"HugeVersion":            set(cloudevents.HeaderAggregateVersion, "99999999999999999999"),
		"SchemaVersionOverflow":  set(cloudevents.HeaderSchemaVersion, "4294967297"),
		"BadTime":                set(cloudevents.HeaderTime, "yesterday"),
		"ContentType":            set(cloudevents.HeaderContentType, "text/plain"),
		"NULInKey":               func(r *kgo.Record) { r.Key = []byte("inv\x0042") },
		"InvalidUTF8Key":         func(r *kgo.Record) { r.Key = []byte{0xc3, 0x28} },
		"NotJSON":                func(r *kgo.Record) { r.Value = []byte("{") },
		"Tombstone":              func(r *kgo.Record) { r.Value = nil },
		"ConflictingDuplicate": func(r *kgo.Record) {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: "CE_TYPE", Value: []byte("other.type")})
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := cloudevents.Record("t", sample())
			mod(r)
			_, err := cloudevents.Decode(r)
			require.ErrorIs(t, err, cloudevents.ErrInvalid)
			require.True(t, utf8.ValidString(err.Error()) && !strings.ContainsRune(err.Error(), 0), "the error is safe to log and store: %q", err)
		})
	}
}

// TestDecodeTolerates: what is not the event's identity does not cost the
// event. Unknown headers may hold anything, a malformed trace context is
// dropped, and a missing ce_time falls back to the record's timestamp.
func TestDecodeTolerates(t *testing.T) {
	t.Parallel()
	r := cloudevents.Record("t", sample())
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: "x-\x00weird", Value: []byte{0, 0xff, 0xfe}})
	for i, h := range r.Headers {
		switch h.Key {
		case cloudevents.HeaderTraceparent:
			r.Headers[i].Value = []byte("00-zz")
		case cloudevents.HeaderTime:
			r.Headers[i].Key = "x-time"
		}
	}
	r.Timestamp = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	e, err := cloudevents.Decode(r)
	require.NoError(t, err)
	require.Empty(t, e.Traceparent)
	require.Empty(t, e.Tracestate, "no trace state without a trace parent")
	require.Equal(t, r.Timestamp, e.Time)
}

// FuzzDecode feeds arbitrary keys, values and headers. Whatever Decode
// accepts is safe to store and encodes back to the same event.
func FuzzDecode(f *testing.F) {
	good := cloudevents.Record("t", sample())
	f.Add(good.Key, good.Value, encodeHeaders(good.Headers))
	bad := cloudevents.Record("t", sample())
	bad.Headers[2].Value = []byte("x\x00y")
	f.Add(bad.Key, bad.Value, encodeHeaders(bad.Headers))
	f.Add([]byte{}, []byte("null"), []byte{})
	f.Fuzz(func(t *testing.T, key, value, rawHeaders []byte) {
		r := &kgo.Record{Key: key, Value: value, Headers: decodeHeaders(rawHeaders), Timestamp: time.Unix(1, 0).UTC()}
		e, err := cloudevents.Decode(r)
		if err != nil {
			if !errors.Is(err, cloudevents.ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			if !utf8.ValidString(err.Error()) || strings.ContainsRune(err.Error(), 0) {
				t.Fatalf("error is not safe to store: %q", err)
			}
			return
		}
		for _, s := range []string{e.Type, e.Source, e.AggregateType, e.AggregateID} {
			if s == "" || !utf8.ValidString(s) || strings.IndexFunc(s, unicode.IsControl) >= 0 {
				t.Fatalf("accepted an attribute a text column could refuse: %q", s)
			}
		}
		if e.ID == uuid.Nil || e.AggregateVersion < 1 || e.SchemaVersion < 1 {
			t.Fatalf("accepted an event without identity or order: %+v", e)
		}
		again, err := cloudevents.Decode(cloudevents.Record("t", e))
		if err != nil {
			t.Fatalf("an accepted event does not survive its own encoding: %v", err)
		}
		if !again.Time.Equal(e.Time) {
			t.Fatalf("time changed: %v -> %v", e.Time, again.Time)
		}
		again.Time = e.Time
		require.Equal(t, e, again)
	})
}

// encodeHeaders and decodeHeaders map headers to and from one byte string
// (length-prefixed keys and values) so the fuzzer can mutate them freely.
func encodeHeaders(hs []kgo.RecordHeader) []byte {
	var b []byte
	for _, h := range hs {
		b = binary.AppendUvarint(b, uint64(len(h.Key)))
		b = append(b, h.Key...)
		b = binary.AppendUvarint(b, uint64(len(h.Value)))
		b = append(b, h.Value...)
	}
	return b
}

func decodeHeaders(b []byte) []kgo.RecordHeader {
	var out []kgo.RecordHeader
	next := func() ([]byte, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, false
		}
		v := b[k : k+int(n)]
		b = b[k+int(n):]
		return v, true
	}
	for len(b) > 0 {
		k, ok := next()
		if !ok {
			break
		}
		v, ok := next()
		if !ok {
			break
		}
		out = append(out, kgo.RecordHeader{Key: string(k), Value: v})
	}
	return out
}
