// Package eventtypes compiles the event types a service registers, once,
// for the two sides of the outbox that check rows against them: the Writer,
// which validates payloads with the compiled JSON Schemas, and the relay,
// which needs the ordering policies and which schema versions exist.
//
// It takes a neutral description of each type (Spec) rather than
// outbox.EventType, because package outbox imports it: the root package
// and the relay each convert their []outbox.EventType with the same
// mapping of orderings (Strict, Independent below, equal to outbox.Strict
// and outbox.Independent).
package eventtypes

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

// Orderings, with the values of outbox.Strict and outbox.Independent.
const (
	Strict      = 0
	Independent = 1
)

// Spec is one outbox.EventType: its name, its ordering (Strict or
// Independent) and its JSON Schema per schema version.
type Spec struct {
	Name     string
	Ordering int
	Schemas  map[int][]byte
}

// Set is the compiled view of a list of Specs.
type Set struct {
	byName      map[string]*Type
	names       []string // in the order given
	independent []string // names passed to the claim query's ordering guard
}

// Type is one Spec with a ready-to-use validator per schema version.
type Type struct {
	Spec
	schemas map[int]*jsonschema.Schema
}

// Compile checks the event types and compiles their JSON Schemas once,
// at start-up: a schema that does not compile is a programming error and
// refuses to start, rather than parking every event of the type later.
func Compile(specs []Spec) (*Set, error) {
	if len(specs) == 0 {
		return nil, errors.New("no event types configured")
	}
	s := &Set{byName: make(map[string]*Type, len(specs))}
	for _, t := range specs {
		if t.Name == "" {
			return nil, errors.New("event type with an empty name")
		}
		// The name travels in ce_type: one the consumer's Decode would
		// refuse could never be delivered.
		if !cloudevents.ValidText(t.Name, cloudevents.MaxTypeBytes) {
			return nil, fmt.Errorf("event type %q is not printable UTF-8 of at most %d bytes", t.Name, cloudevents.MaxTypeBytes)
		}
		if _, dup := s.byName[t.Name]; dup {
			return nil, fmt.Errorf("event type %q listed twice", t.Name)
		}
		if t.Ordering != Strict && t.Ordering != Independent {
			return nil, fmt.Errorf("event type %q: unknown ordering policy %d", t.Name, t.Ordering)
		}
		if len(t.Schemas) == 0 {
			return nil, fmt.Errorf("event type %q has no JSON Schema", t.Name)
		}
		ct := &Type{Spec: t, schemas: make(map[int]*jsonschema.Schema, len(t.Schemas))}
		for v, doc := range t.Schemas {
			if v < 1 || v > math.MaxInt32 { // schema_version is an integer column
				return nil, fmt.Errorf("event type %q: schema version %d, want 1 to %d", t.Name, v, math.MaxInt32)
			}
			sc, err := compileSchema(t.Name, v, doc)
			if err != nil {
				return nil, err
			}
			ct.schemas[v] = sc
		}
		s.byName[t.Name] = ct
		s.names = append(s.names, t.Name)
		if t.Ordering == Independent {
			s.independent = append(s.independent, t.Name)
		}
	}
	slices.Sort(s.independent)
	return s, nil
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
	sc, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("event type %q v%d: compile JSON Schema: %w", name, version, err)
	}
	return sc, nil
}

// Lookup returns the type named name.
func (s *Set) Lookup(name string) (*Type, bool) {
	t, ok := s.byName[name]
	return t, ok
}

// Names returns the names of the types, in the order they were given.
func (s *Set) Names() []string { return slices.Clone(s.names) }

// Independent returns the names of the independent types, sorted: the
// claim query's ordering guard leaves them out.
func (s *Set) Independent() []string { return s.independent }

// Schema returns the compiled JSON Schema of one schema version.
func (t *Type) Schema(version int) (*jsonschema.Schema, bool) {
	sc, ok := t.schemas[version]
	return sc, ok
}
