package inbox_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/inbox"
)

func TestStrictJSON(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{`{}`, `{"a":1,"b":{"a":2}}`, `[{"a":1},{"a":1}]`, ` "x" `, `{"a":[1,{"b":null}],"c":"\u00e9"}`} {
		require.NoError(t, inbox.StrictJSON([]byte(ok)), ok)
	}
	for name, bad := range map[string]string{
		"DuplicateKey":       `{"a":1,"a":2}`,
		"NestedDuplicate":    `{"x":{"a":1,"b":2,"a":3}}`,
		"InvalidUTF8":        "{\"a\":\"E\xffR\"}",
		"InvalidUTF8InKey":   "{\"\xfe\":1}",
		"TwoValues":          `{}{}`,
		"Truncated":          `{"a":`,
		"Empty":              ``,
		"TrailingGarbage":    `{"a":1} x`,
		"DuplicateInArrayOb": `[{"a":1,"a":1}]`,
	} {
		require.Error(t, inbox.StrictJSON([]byte(bad)), name)
	}
}

func TestSchemasCheck(t *testing.T) {
	t.Parallel()
	s, err := inbox.NewSchemas(map[string]map[int][]byte{
		"thing.done": {1: []byte(`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`)},
	})
	require.NoError(t, err)
	ev := func(typ string, v int, payload string) inbox.Event {
		return inbox.Event{Type: typ, SchemaVersion: v, Payload: []byte(payload)}
	}
	require.NoError(t, s.Check(ev("thing.done", 1, `{"n":1}`)))
	require.ErrorIs(t, s.Check(ev("thing.other", 1, `{"n":1}`)), inbox.ErrUnknownType)
	require.ErrorIs(t, s.Check(ev("thing.done", 2, `{"n":1}`)), inbox.ErrUnknownType)
	require.ErrorIs(t, s.Check(ev("thing.done", 1, `{"n":"1"}`)), inbox.ErrInvalidPayload)
	require.ErrorIs(t, s.Check(ev("thing.done", 1, `{"n":1,"n":"x"}`)), inbox.ErrInvalidPayload)
	err = s.Check(ev("thing.done", 1, `{"n":"secret-value"}`))
	require.ErrorIs(t, err, inbox.ErrInvalidEvent, "parked, not retried")
	require.NotContains(t, err.Error(), "secret-value", "errors never quote the payload")

	_, err = inbox.NewSchemas(map[string]map[int][]byte{"x": {1: []byte(`{`)}})
	require.Error(t, err)
}

// FuzzStrictJSON: StrictJSON never panics, and accepts nothing that is not
// valid JSON.
func FuzzStrictJSON(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"a":2}`, `[1,2]`, "\"\xff\"", `{"a":{"b":[{"c":1}]}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if inbox.StrictJSON(b) == nil && !json.Valid(b) {
			t.Fatalf("accepted invalid JSON %q", b)
		}
	})
}
