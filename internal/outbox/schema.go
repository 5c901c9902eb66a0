package outbox

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// eventTypes is the relay's compiled view of its EventTypes: the ordering
// policy and a ready-to-use validator per schema version.
type eventTypes struct {
	byName      map[string]*compiledType
	independent []string // names passed to the claim query's ordering guard
}

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
			if v < 1 {
				return nil, fmt.Errorf("event type %q: schema version %d, want 1 or more", t.Name, v)
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

// check decides whether an event may be sent at all (R5). Each failure is
// deterministic: sending the same row again can only fail the same way, so
// the caller parks it instead of retrying.
func (et *eventTypes) check(eventType string, schemaVersion int, payload []byte) (ErrorClass, error) {
	t, ok := et.byName[eventType]
	if !ok {
		// During a rolling deploy an older relay may meet a type that only
		// newer code knows: the row is parked and can be resumed, with the
		// same event_id, once every relay runs the new code (O4).
		return ClassUnknownEventType, fmt.Errorf("event type %q is not known to this relay", eventType)
	}
	s, ok := t.schemas[schemaVersion]
	if !ok {
		return ClassUnknownSchemaVersion, fmt.Errorf("event type %q has no schema version %d in this relay", eventType, schemaVersion)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return ClassSchemaInvalid, fmt.Errorf("payload is not JSON: %w", err)
	}
	if err := s.Validate(inst); err != nil {
		return ClassSchemaInvalid, &schemaError{eventType: eventType, version: schemaVersion, err: err}
	}
	return "", nil
}

// schemaError is a payload that fails its JSON Schema. Error gives the full
// validator output, which may quote payload values: it goes into the row's
// last_error (the payload is in that row anyway) but never into logs, which
// get Summary instead.
type schemaError struct {
	eventType string
	version   int
	err       error
}

func (e *schemaError) Error() string {
	return fmt.Sprintf("payload fails JSON Schema %s v%d: %v", e.eventType, e.version, e.err)
}

func (e *schemaError) Unwrap() error { return e.err }

// Summary names the failing locations and keywords without any values.
func (e *schemaError) Summary() string {
	var ve *jsonschema.ValidationError
	if !errors.As(e.err, &ve) {
		return fmt.Sprintf("payload fails JSON Schema %s v%d", e.eventType, e.version)
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
	return fmt.Sprintf("payload fails JSON Schema %s v%d at %s", e.eventType, e.version, strings.Join(parts, ", "))
}
