package outbox

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

// eventTypes is the compiled view of a list of EventTypes, shared by the
// Writer, which validates payloads with the compiled schemas, and the
// Relay, which needs the ordering policies and which versions exist.
type eventTypes struct {
	byName      map[string]*compiledType
	independent []string // names passed to the claim query's ordering guard
}

// compiledType is one EventType with a ready-to-use validator per schema
// version.
type compiledType struct {
	EventType
	schemas map[int]*jsonschema.Schema
}

// compileTypes checks the event types and compiles their JSON Schemas once,
// at start-up: a schema that does not compile is a programming error and
// refuses to start, rather than parking every event of the type later.
func compileTypes(types []EventType) (*eventTypes, error) {
	if len(types) == 0 {
		return nil, errors.New("no event types configured")
	}
	et := &eventTypes{byName: make(map[string]*compiledType, len(types))}
	for _, t := range types {
		if t.Name == "" {
			return nil, errors.New("event type with an empty name")
		}
		// The name travels in ce_type: one the consumer's Decode would
		// refuse could never be delivered.
		if !cloudevents.ValidText(t.Name, cloudevents.MaxTypeBytes) {
			return nil, fmt.Errorf("event type %q is not printable UTF-8 of at most %d bytes", t.Name, cloudevents.MaxTypeBytes)
		}
		if _, dup := et.byName[t.Name]; dup {
			return nil, fmt.Errorf("event type %q listed twice", t.Name)
		}
		if t.Ordering != Strict && t.Ordering != Independent {
			return nil, fmt.Errorf("event type %q: unknown ordering policy %d", t.Name, t.Ordering)
		}
		if len(t.Schemas) == 0 {
			return nil, fmt.Errorf("event type %q has no JSON Schema", t.Name)
		}
		ct := &compiledType{EventType: t, schemas: make(map[int]*jsonschema.Schema, len(t.Schemas))}
		for v, doc := range t.Schemas {
			if v < 1 || v > math.MaxInt32 { // schema_version is an integer column
				return nil, fmt.Errorf("event type %q: schema version %d, want 1 to %d", t.Name, v, math.MaxInt32)
			}
			s, err := compileSchema(t.Name, v, doc)
			if err != nil {
				return nil, err
			}
			ct.schemas[v] = s
		}
		et.byName[t.Name] = ct
		if t.Ordering == Independent {
			et.independent = append(et.independent, t.Name)
		}
	}
	slices.Sort(et.independent)
	return et, nil
}

func compileSchema(name string, version int, doc []byte) (*jsonschema.Schema, error) {
	parsed, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return nil, fmt.Errorf("event type %q v%d: parse JSON Schema: %w", name, version, err)
	}
	// Each schema is compiled on its own, under a private URL, so that two
	// documents sharing an $id cannot resolve into each other.
	c := jsonschema.NewCompiler()
	url := fmt.Sprintf("urn:outbox:schema:%s:v%d", name, version)
	if err := c.AddResource(url, parsed); err != nil {
		return nil, fmt.Errorf("event type %q v%d: add JSON Schema: %w", name, version, err)
	}
	s, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("event type %q v%d: compile JSON Schema: %w", name, version, err)
	}
	return s, nil
}

// admit is the relay's guard before it sends a row (R5): the row's type
// and schema version must be ones this relay was configured with. Both
// failures are deterministic, so the caller parks the row instead of
// retrying it.
//
// The payload is deliberately not checked here. The Writer validated it
// against the same JSON Schema inside the business transaction; the column
// is jsonb, so PostgreSQL already guarantees it is well-formed JSON; and a
// published schema version is never changed to reject payloads it used to
// accept (docs/events.md), so a payload valid when written stays valid. Validating every payload again would
// cost each send a JSON decode and a schema walk to re-prove all that.
// What admit guards against is rows this relay cannot know: written by
// older or newer code during a rolling deploy, or by hand. Whoever writes
// rows without the Writer (a repair of a parked row, O4) checks them with
// Writer.Validate first.
func (et *eventTypes) admit(eventType string, schemaVersion int) (ErrorClass, error) {
	t, ok := et.byName[eventType]
	if !ok {
		// During a rolling deploy an older relay may meet a type that only
		// newer code knows: the row is parked and can be resumed, with the
		// same event_id, once every relay runs the new code (O4).
		return ClassUnknownEventType, fmt.Errorf("event type %q is not known to this relay", eventType)
	}
	if _, ok := t.schemas[schemaVersion]; !ok {
		return ClassUnknownSchemaVersion, fmt.Errorf("event type %q has no schema version %d in this relay", eventType, schemaVersion)
	}
	return "", nil
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
