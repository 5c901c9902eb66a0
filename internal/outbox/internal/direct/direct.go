// Package direct holds what the two ends of the publish-mode migration
// (O7) share: the names of the modes, as stored in outbox_publish_mode and
// returned by the insert, and the digests of a record that the Writer logs
// for each direct send and the relay compares in shadow mode. The Writer
// (package outbox) and the relay import it; the typed modes an operator
// switches are operate.PublishMode.
package direct

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
)

// The publish modes, as stored (operate.ModeDirect, ModeShadow and
// ModeOutbox have the same values).
const (
	ModeDirect = "direct"
	ModeShadow = "shadow"
	ModeOutbox = "outbox"
)

// Digest is what the shadow comparison looks at: the topic, and
// SHA-256 digests of the key, the value and each header. Digests rather
// than copies, so the log never holds a payload.
type Digest struct {
	Topic      string
	Key, Value []byte
	headers    map[string]string // name (with #n for repeats) -> hex SHA-256
}

// DigestRecord digests rec.
func DigestRecord(rec *kgo.Record) Digest {
	k, v := sha256.Sum256(rec.Key), sha256.Sum256(canonicalJSON(rec.Value))
	d := Digest{Topic: rec.Topic, Key: k[:], Value: v[:], headers: make(map[string]string, len(rec.Headers))}
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

// HeadersJSON is the header digests as logged in outbox_direct_log.headers.
func (d Digest) HeadersJSON() []byte {
	b, err := json.Marshal(d.headers) // map[string]string always marshals
	if err != nil {
		panic(err)
	}
	return b
}

// perSendHeaders are left out of the comparison: the trace context is
// the sender's own, different for the direct path and the relay by design.
var perSendHeaders = map[string]bool{"traceparent": true, "tracestate": true}

// Compare says how the record the relay would send differs from what the
// direct path logged; empty when they match.
func (d Digest) Compare(logged outboxdb.DirectLogForEventsRow) string {
	var diffs []string
	if logged.Topic == nil || *logged.Topic != d.Topic {
		diffs = append(diffs, "topic")
	}
	if !bytes.Equal(logged.KeySha256, d.Key) {
		diffs = append(diffs, "key")
	}
	if !bytes.Equal(logged.ValueSha256, d.Value) {
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
