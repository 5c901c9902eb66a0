package inbox_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/inbox"
)

// parked is a parked record as read back from the table.
type parked struct {
	eventID *uuid.UUID
	key     []byte
	value   []byte
	headers []kgo.RecordHeader
	reason  string
}

func readParked(t testing.TB, f *fixture) []parked {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), "SELECT event_id, record_key, record_value, headers, reason FROM inbox_parked_record ORDER BY id")
	require.NoError(t, err)
	defer rows.Close()
	var out []parked
	for rows.Next() {
		var p parked
		var hj []byte
		require.NoError(t, rows.Scan(&p.eventID, &p.key, &p.value, &hj, &p.reason))
		var hs []inbox.ParkedHeader
		require.NoError(t, json.Unmarshal(hj, &hs))
		for _, h := range hs {
			k, v := h.Key, []byte(h.Value)
			if h.KeyBase64 != nil {
				k = string(h.KeyBase64)
			}
			if h.ValueBase64 != nil {
				v = h.ValueBase64
			}
			p.headers = append(p.headers, kgo.RecordHeader{Key: k, Value: v})
		}
		out = append(out, p)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestParkRecord: records PostgreSQL could not store as text (a NUL in a
// header key or value, invalid UTF-8 in ce_id) are parked losslessly, once
// per record, and a different record is never hidden behind an id or a
// position seen before.
func TestParkRecord(t *testing.T) {
	t.Parallel()
	f := setup(t, time.Minute)
	ctx := context.Background()
	id := uuid.New()
	hostile := &kgo.Record{Topic: "t", Partition: 2, Offset: 9, Key: []byte("k\x00"), Value: []byte("\xff garbage"),
		Headers: []kgo.RecordHeader{
			{Key: "ce_id", Value: []byte(id.String())},
			{Key: "ce_type", Value: []byte("order.paid\x00")},
			{Key: "x-\x00key", Value: []byte{0, 0xff}},
			{Key: "plain", Value: []byte("text é")},
		}}
	stored, err := inbox.ParkRecord(ctx, f.pool, hostile, "ce_type \"order.paid\\x00\" is not printable \x00 \xff")
	require.NoError(t, err)
	require.True(t, stored)
	stored, err = inbox.ParkRecord(ctx, f.pool, hostile, "again")
	require.NoError(t, err)
	require.False(t, stored, "a redelivered record is parked once")

	// Another record claiming the same event id, with other content, is
	// kept too: nothing is hidden behind an id.
	other := &kgo.Record{Topic: "t", Partition: 2, Offset: 10, Key: []byte("k"), Value: []byte("{}"), Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id.String())}}}
	stored, err = inbox.ParkRecord(ctx, f.pool, other, "other")
	require.NoError(t, err)
	require.True(t, stored)

	// Without a readable id, the position identifies the record; a
	// recreated topic's new record at an old offset is still stored.
	noID := &kgo.Record{Topic: "t", Partition: 0, Offset: 1, Key: []byte("a"), Value: []byte("1"),
		Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte("\xff" + id.String()[1:])}}}
	recreated := &kgo.Record{Topic: "t", Partition: 0, Offset: 1, Key: []byte("b"), Value: []byte("2")}
	for _, r := range []*kgo.Record{noID, noID, recreated} {
		_, err := inbox.ParkRecord(ctx, f.pool, r, "undecodable")
		require.NoError(t, err)
	}

	got := readParked(t, f)
	require.Len(t, got, 4)
	require.Equal(t, &id, got[0].eventID)
	require.Equal(t, hostile.Key, got[0].key)
	require.Equal(t, hostile.Value, got[0].value)
	require.Equal(t, hostile.Headers, got[0].headers, "every header byte survives")
	require.Equal(t, "ce_type \"order.paid\\x00\" is not printable \uFFFD \uFFFD", got[0].reason)
	require.Nil(t, got[2].eventID, "an unreadable ce_id is no identity")
	require.Equal(t, []byte("b"), got[3].key)
	st, err := f.ib.RefreshStats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(4), st.ParkedRecords)
}

// FuzzRecord is the consumer's contract with arbitrary bytes in a record's
// key, value and headers: the record either decodes into an event the inbox
// processes, or it is parked, losslessly. Neither path may fail because of
// what the record holds, or one record could stop a consumer for good.
func FuzzRecord(f *testing.F) {
	f.Add([]byte("agg-1"), []byte(`{}`), headerBytes(validHeaders(uuid.New(), "agg-1")))
	f.Add([]byte("agg-1\x00"), []byte("\xff"), headerBytes(append(validHeaders(uuid.New(), "agg-1"), kgo.RecordHeader{Key: "x\x00", Value: []byte{0}})))
	f.Add([]byte{}, []byte{}, []byte{})

	fix := setup(f, time.Hour)
	f.Fuzz(func(t *testing.T, key, value, raw []byte) {
		ctx := context.Background()
		r := &kgo.Record{Topic: "fuzz", Partition: 1, Offset: int64(len(key)), Key: key, Value: value,
			Headers: splitHeaders(raw), Timestamp: time.Unix(1, 0)}
		e, err := inbox.DecodeRecord(r)
		if err != nil {
			if !errors.Is(err, inbox.ErrInvalidEvent) {
				t.Fatalf("decode error is not ErrInvalidEvent: %v", err)
			}
			if _, err := inbox.ParkRecord(ctx, fix.pool, r, err.Error()); err != nil {
				t.Fatalf("parking failed, the consumer would stop here: %v", err)
			}
			return
		}
		if _, err := fix.ib.Handle(ctx, e); err != nil {
			t.Fatalf("a decoded event failed to process: %v", err)
		}
	})
}

func validHeaders(id uuid.UUID, agg string) []kgo.RecordHeader {
	h := func(k, v string) kgo.RecordHeader { return kgo.RecordHeader{Key: k, Value: []byte(v)} }
	return []kgo.RecordHeader{
		h("ce_specversion", "1.0"), h("ce_id", id.String()), h("ce_type", "thing.step1"), h("ce_source", "urn:test"),
		h("ce_subject", agg), h("ce_aggregatetype", "thing"), h("ce_aggregateversion", "1"), h("ce_schemaversion", "1"),
	}
}

// headerBytes and splitHeaders map headers to and from one byte string
// (length-prefixed keys and values) so the fuzzer can mutate them freely.
func headerBytes(hs []kgo.RecordHeader) []byte {
	var b []byte
	for _, h := range hs {
		b = binary.AppendUvarint(b, uint64(len(h.Key)))
		b = append(b, h.Key...)
		b = binary.AppendUvarint(b, uint64(len(h.Value)))
		b = append(b, h.Value...)
	}
	return b
}

func splitHeaders(b []byte) []kgo.RecordHeader {
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
