// Package docs embeds the published event contracts.
//
// The JSON Schemas in docs/schemas are both the documentation consumers read
// and the documents the orders service's outbox writer validates every
// payload against when it is written (R5, L2), so the two can never
// disagree.
package docs

import (
	"embed"
	"fmt"
	"io/fs"
)

//go:embed schemas/*.json
var schemas embed.FS

// EventSchema returns the JSON Schema of an event type at a schema version.
func EventSchema(eventType string, version int) ([]byte, error) {
	b, err := fs.ReadFile(schemas, fmt.Sprintf("schemas/%s.v%d.json", eventType, version))
	if err != nil {
		return nil, fmt.Errorf("no schema for %s v%d: %w", eventType, version, err)
	}
	return b, nil
}
