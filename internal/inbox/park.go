package inbox

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/inbox/internal/inboxdb"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

// ParkedHeader is one header of a parked record as stored in its headers
// JSON array. A key or value that PostgreSQL's JSON cannot hold as text
// (invalid UTF-8, or a NUL, which jsonb refuses) is stored in base64
// instead, so that nothing of the record is lost or altered.
type ParkedHeader struct {
	Key       string `json:"key,omitempty"`
	KeyBase64 []byte `json:"key_base64,omitempty"`
	Value     string `json:"value,omitempty"`
	// ValueBase64 holds the value when it is not storable text.
	ValueBase64 []byte `json:"value_base64,omitempty"`
}

// parkedHeader keeps key and value readable when they are text.
func parkedHeader(key string, value []byte) ParkedHeader {
	var h ParkedHeader
	if jsonText(key) {
		h.Key = key
	} else {
		h.KeyBase64 = []byte(key)
	}
	if jsonText(string(value)) {
		h.Value = string(value)
	} else {
		h.ValueBase64 = value
	}
	return h
}

// jsonText reports whether s survives as a jsonb string unchanged.
func jsonText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// ParkRecord stores a record that can never be processed (C6), with its raw
// key, value and headers and the reason, so that it neither blocks its
// partition nor vanishes. It never fails because of what the record holds:
// bytes go to bytea, headers to the lossless JSON of ParkedHeader, and the
// reason is cleaned; only a database outage can make it fail, and that is
// worth retrying.
//
// A record is identified by its event id when its ce_id header holds one,
// by its topic position otherwise, together with a hash of its content.
// Parking the same record twice (a redelivery after a crash) stores it
// once, and the result says whether this call stored it; a different
// record is never hidden behind an id or offset seen before.
func ParkRecord(ctx context.Context, db DBTX, r *kgo.Record, reason string) (stored bool, err error) {
	headers := make([]ParkedHeader, len(r.Headers))
	var eventID *uuid.UUID
	h := sha256.New()
	for i, kv := range r.Headers {
		headers[i] = parkedHeader(kv.Key, kv.Value)
		writeField(h, []byte(kv.Key))
		writeField(h, kv.Value)
		if strings.ToLower(kv.Key) == cloudevents.HeaderID && eventID == nil {
			if id, err := uuid.Parse(string(kv.Value)); err == nil && len(kv.Value) == cloudevents.MaxIDBytes {
				eventID = &id
			}
		}
	}
	writeField(h, r.Key)
	writeField(h, r.Value)
	hj, err := json.Marshal(headers)
	if err != nil {
		return false, fmt.Errorf("encode parked record headers: %w", err)
	}
	source := cleanText(r.Topic)
	parkKey := fmt.Sprintf("position:%s/%d@%d", source, r.Partition, r.Offset)
	if eventID != nil {
		parkKey = "event:" + eventID.String()
	}
	key, value := r.Key, r.Value
	if key == nil {
		key = []byte{}
	}
	if value == nil {
		value = []byte{}
	}
	n, err := inboxdb.New(db).InboxParkedRecordInsert(ctx, inboxdb.InboxParkedRecordInsertParams{
		Source: source, Partition: r.Partition, RecordOffset: r.Offset, EventID: eventID,
		ParkKey: parkKey, RecordSha256: h.Sum(nil),
		RecordKey: key, RecordValue: value, Headers: hj, Reason: cleanText(reason),
	})
	if err != nil {
		return false, fmt.Errorf("park record %s/%d@%d: %w", source, r.Partition, r.Offset, err)
	}
	return n == 1, nil
}

// writeField adds one length-prefixed field to the content hash, so that
// moving bytes between fields changes the hash.
func writeField(h interface{ Write([]byte) (int, error) }, b []byte) {
	var n [binary.MaxVarintLen64]byte
	_, _ = h.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))])
	_, _ = h.Write(b)
}

// maxText is the bound of the inbox's free-text columns (reasons, errors).
const maxText = 1024

// cleanText makes s storable in a text column and safe in a log: invalid
// UTF-8 and NULs are replaced, and it is cut to maxText characters.
func cleanText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if utf8.RuneCountInString(s) <= maxText {
		return s
	}
	n := 0
	for i := range s {
		if n == maxText-1 {
			return s[:i] + "…"
		}
		n++
	}
	return s
}
