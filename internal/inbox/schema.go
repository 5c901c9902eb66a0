package inbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// ErrUnknownType wraps ErrInvalidEvent for an event whose type or schema
// version the consumer has no schema for. It does not take a version: see
// Schemas.
var ErrUnknownType = fmt.Errorf("%w: unknown event type or schema version", ErrInvalidEvent)

// ErrInvalidPayload wraps ErrInvalidEvent for a payload that is not strict
// JSON or that its JSON Schema refuses.
var ErrInvalidPayload = fmt.Errorf("%w: invalid payload", ErrInvalidEvent)

// Schemas checks every payload a consumer receives against the JSON Schema
// its producer publishes for the event's type and schema version, before
// the event can take a version or have an effect (R5, C7). The topic is
// not trusted: anyone who can produce to it could send a payload the
// producer would never write, and the consumer must not act on it.
//
// A payload must also be strict JSON: valid UTF-8 (encoding/json would
// silently turn invalid bytes into U+FFFD, so an email could carry
// "E\uFFFDR"), one value, and no object key twice (decoders disagree about
// which copy wins, so a schema could check one and the consumer read the
// other).
//
// A type or schema version without a schema is refused (ErrUnknownType)
// and so never takes a place in its aggregate's sequence. A consumer that
// meets a type the producer added after it was built therefore parks the
// record; the version stays a gap, the aggregate's later versions are held
// and, once the gap window passes, resolved from the source of truth; after
// an upgrade that knows the type, the parked record can be retried.
type Schemas struct {
	byType map[string]map[int]*jsonschema.Schema
}

// NewSchemas compiles the JSON Schemas given by event type and schema
// version. A schema that does not compile is a programming error.
func NewSchemas(docs map[string]map[int][]byte) (*Schemas, error) {
	s := &Schemas{byType: make(map[string]map[int]*jsonschema.Schema, len(docs))}
	for typ, versions := range docs {
		s.byType[typ] = make(map[int]*jsonschema.Schema, len(versions))
		for v, doc := range versions {
			parsed, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
			if err != nil {
				return nil, fmt.Errorf("inbox: JSON Schema of %s v%d: %w", typ, v, err)
			}
			// Each schema under a private URL of its own, so two documents
			// sharing an $id cannot resolve into each other.
			url := fmt.Sprintf("urn:inbox:schema:%s:v%d", typ, v)
			c := jsonschema.NewCompiler()
			if err := c.AddResource(url, parsed); err != nil {
				return nil, fmt.Errorf("inbox: JSON Schema of %s v%d: %w", typ, v, err)
			}
			compiled, err := c.Compile(url)
			if err != nil {
				return nil, fmt.Errorf("inbox: JSON Schema of %s v%d: %w", typ, v, err)
			}
			s.byType[typ][v] = compiled
		}
	}
	return s, nil
}

// Check returns nil when e's type and schema version have a schema and
// its payload is strict JSON that the schema accepts. Its errors wrap
// ErrUnknownType or ErrInvalidPayload (both ErrInvalidEvent: park the
// record) and never quote the payload, which may hold personal data.
func (s *Schemas) Check(e Event) error {
	schema, ok := s.byType[e.Type][e.SchemaVersion]
	if !ok {
		return fmt.Errorf("%w: no schema for %q v%d", ErrUnknownType, e.Type, e.SchemaVersion)
	}
	if err := StrictJSON(e.Payload); err != nil {
		return fmt.Errorf("%w: %s v%d: %w", ErrInvalidPayload, e.Type, e.SchemaVersion, err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(e.Payload))
	if err != nil {
		return fmt.Errorf("%w: %s v%d: not JSON", ErrInvalidPayload, e.Type, e.SchemaVersion)
	}
	if err := schema.Validate(doc); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalidPayload, schemaFailure(e.Type, e.SchemaVersion, err))
	}
	return nil
}

// StrictJSON returns nil when b is exactly one JSON value, valid UTF-8,
// with no object key repeated.
func StrictJSON(b []byte) error {
	if !utf8.Valid(b) {
		return errors.New("not valid UTF-8")
	}
	type object struct {
		keys    map[string]bool
		wantKey bool
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var stack []*object // nil entries are arrays
	values := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return errors.New("not JSON")
		}
		if len(stack) == 0 {
			if values++; values > 1 {
				return errors.New("more than one JSON value")
			}
		}
		var top *object
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			continue
		}
		if top != nil && top.wantKey {
			k, _ := tok.(string)
			if top.keys[k] {
				return fmt.Errorf("object key %q appears twice", truncate(k, 64))
			}
			top.keys[k] = true
			top.wantKey = false
			continue
		}
		if top != nil {
			top.wantKey = true // this token is the member's value
		}
		if d, ok := tok.(json.Delim); ok {
			if d == '{' {
				stack = append(stack, &object{keys: map[string]bool{}, wantKey: true})
			} else {
				stack = append(stack, nil)
			}
		}
	}
	switch {
	case values == 0:
		return errors.New("empty")
	case len(stack) > 0:
		return errors.New("not JSON")
	}
	return nil
}

// schemaFailure names the failing locations and keywords of a validation
// error, without any value from the payload.
func schemaFailure(eventType string, version int, err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return fmt.Sprintf("%s v%d fails its JSON Schema", eventType, version)
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
	return fmt.Sprintf("%s v%d fails its JSON Schema at %s", eventType, version, strings.Join(parts, ", "))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
