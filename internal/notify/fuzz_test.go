package notify

import (
	"encoding/binary"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
)

// FuzzDecodeRecord feeds arbitrary keys, values and headers to the
// notifier's decoder. It never panics; a record it accepts has an event the
// projection and the ledger can store, and a record it refuses is one the
// consumer parks (never an error it would retry for ever).
func FuzzDecodeRecord(f *testing.F) {
	o := newOrder()
	for _, typ := range []string{TypePlaced, TypePaid, TypeCancelled, TypeRefundRequested, TypeShipped} {
		r := o.record(f, o.next(typ, nil))
		f.Add(r.Key, r.Value, packHeaders(r.Headers))
	}
	r := o.record(f, o.next(TypePaid, map[string]any{"currency": "EU\u0000"}))
	f.Add(r.Key, r.Value, packHeaders(r.Headers))
	f.Fuzz(func(t *testing.T, key, value, headers []byte) {
		e, err := DecodeRecord(&kgo.Record{Key: key, Value: value, Headers: unpackHeaders(headers)})
		if err != nil {
			if !parkable(err) {
				t.Fatalf("a refused record must be parkable, got %v", err)
			}
			return
		}
		if e.ID == uuid.Nil || e.AggregateVersion < 1 {
			t.Fatalf("accepted an event without identity: %+v", e)
		}
		if !isKnownType(e.Type) {
			t.Fatalf("accepted an event of unknown type %q: it would take a version (C7)", e.Type)
		}
		p, err := parsePayload(e)
		if err != nil {
			t.Fatalf("accepted a payload it cannot parse again: %v", err)
		}
		id, err := uuid.Parse(e.AggregateID)
		if err != nil {
			return // refused when applied (poison), never stored
		}
		_, mail := project(nil, id, e, p)
		if mail == nil {
			return
		}
		for _, s := range []string{mail.Recipient, mail.Subject, mail.Body} {
			if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
				t.Fatalf("an email field a text column would refuse: %q", s)
			}
		}
		if strings.IndexFunc(mail.Recipient, unicode.IsControl) >= 0 || mail.Recipient == "" {
			t.Fatalf("a recipient that is not a bare address: %q", mail.Recipient)
		}
	})
}

func packHeaders(hs []kgo.RecordHeader) []byte {
	var b []byte
	for _, h := range hs {
		b = binary.AppendUvarint(b, uint64(len(h.Key)))
		b = append(b, h.Key...)
		b = binary.AppendUvarint(b, uint64(len(h.Value)))
		b = append(b, h.Value...)
	}
	return b
}

func unpackHeaders(b []byte) []kgo.RecordHeader {
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
			return out
		}
		v, ok := next()
		if !ok {
			return out
		}
		out = append(out, kgo.RecordHeader{Key: string(k), Value: v})
	}
	return out
}
