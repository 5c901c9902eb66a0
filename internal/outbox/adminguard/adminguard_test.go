package adminguard_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/outbox/adminguard"
)

// guarded returns a ServeMux with the outbox's shape of routes behind the
// guard, and a pointer to the body the handler last read.
func guarded(t testing.TB, routes ...string) (http.Handler, *[]byte) {
	t.Helper()
	var seen []byte
	mux := http.NewServeMux()
	ok := func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body) // from memory: cannot fail
		if err != nil {
			panic(err)
		}
		seen = b
		w.WriteHeader(http.StatusNoContent)
	}
	mux.HandleFunc("GET /stats", ok)
	mux.HandleFunc("GET /events/parked", ok)
	mux.HandleFunc("GET /events/{id}", ok)
	mux.HandleFunc("POST /events/{id}/repair", ok)
	mux.HandleFunc("PUT /publish-modes/{type}", ok)
	mux.HandleFunc("POST /replays", ok)
	for _, r := range routes {
		mux.HandleFunc(r, ok)
	}
	h := adminguard.Middleware(adminguard.Config{MaxBodyBytes: 4096, Payload: []string{"payload"},
		Pattern: func(r *http.Request) string { _, p := mux.Handler(r); return p }})(mux)
	return h, &seen
}

type answer struct {
	Type   string `json:"type"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Field  string `json:"field"`
	Errors []struct {
		Field   string `json:"field"`
		Message string `json:"message"`
	} `json:"errors"`
}

func serve(t testing.TB, h http.Handler, method, target, body string) (*httptest.ResponseRecorder, answer) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, rd)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var a answer
	if rec.Code >= 400 {
		require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &a), rec.Body.String())
		require.Equal(t, rec.Code, a.Status)
	}
	return rec, a
}

// TestMiddlewareRefuses: every hostile input a hostile run sent to the
// admin APIs is a 400 problem naming the field, in the detail too, and the
// handler never runs.
func TestMiddlewareRefuses(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", adminguard.MaxReasonChars+1)
	for name, tc := range map[string]struct {
		method, target, body string
		field, message       string
	}{
		"QueryNUL":             {"GET", "/events/parked?type=%00", "", "type", "control characters (found U+0000)"},
		"QueryBadUTF8":         {"GET", "/events/parked?type=%ff%fe", "", "type", "valid UTF-8"},
		"QueryESC":             {"GET", "/events/parked?aggregate=a%1b%5B2K", "", "aggregate", "U+001B"},
		"QueryKey":             {"GET", "/events/parked?ty%00pe=x", "", "query", "parameter names must not contain"},
		"QueryBadEscape":       {"GET", "/events/parked?type=%zz", "", "query", "valid URL query"},
		"PathNUL":              {"GET", "/events/%00", "", "id", "U+0000"},
		"PathBadUTF8":          {"POST", "/events/%ff/repair", `{"reason":"x"}`, "id", "valid UTF-8"},
		"PathTypeNewline":      {"PUT", "/publish-modes/order.placed%0A", `{"mode":"shadow","reason":"x"}`, "type", "U+000A"},
		"PathUnknownRoute":     {"GET", "/nope/%00", "", "path", "U+0000"},
		"ReasonNUL":            {"PUT", "/publish-modes/order.placed", `{"mode":"shadow","reason":"a\u0000b"}`, "reason", "U+0000"},
		"ReasonCR":             {"POST", "/replays", `{"ids":[],"reason":"ok\rrewritten"}`, "reason", "U+000D"},
		"ReasonForgedLine":     {"POST", "/replays", `{"reason":"x\napproved by ops2"}`, "reason", "U+000A"},
		"ReasonESC":            {"POST", "/replays", `{"reason":"\u001b[2Kclean"}`, "reason", "U+001B"},
		"ReasonBidi":           {"POST", "/replays", `{"reason":"abc\u202edcb"}`, "reason", "U+202E"},
		"ReasonTooLong":        {"POST", "/replays", `{"reason":"` + long + `"}`, "reason", "must be at most 1024 characters (it has 1025)"},
		"ReasonBadUTF8":        {"POST", "/replays", "{\"reason\":\"a\xffb\"}", "reason", "valid UTF-8"},
		"TypeNUL":              {"POST", "/replays", `{"type":"\u0000","reason":"x"}`, "type", "U+0000"},
		"NestedID":             {"POST", "/replays", `{"ids":["ok","\u0000"],"reason":"x"}`, "ids[1]", "U+0000"},
		"NestedObject":         {"POST", "/replays", `{"sel":{"a":[{"b":"\t"}]},"reason":"x"}`, "sel.a[0].b", "U+0009"},
		"Key":                  {"POST", "/replays", `{"re\u0000ason":"x"}`, `["re\x00ason"]`, "U+0000"},
		"PayloadNUL":           {"POST", "/events/" + "e1" + "/repair", `{"payload":{"note":"a\u0000"},"reason":"x"}`, "payload.note", `NUL (\u0000)`},
		"PayloadKeyNUL":        {"POST", "/events/e1/repair", `{"payload":{"a\u0000":1},"reason":"x"}`, `payload["a\x00"]`, "NUL"},
		"PayloadBadUTF8":       {"POST", "/events/e1/repair", "{\"payload\":{\"items\":[{\"sku\":\"\xfe\"}]},\"reason\":\"x\"}", "payload.items[0].sku", "valid UTF-8"},
		"BadUTF8OutsideString": {"POST", "/replays", "{\"reason\":\"x\"}\xff", "", "body must be valid UTF-8"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h, seen := guarded(t)
			*seen = []byte("untouched")
			rec, a := serve(t, h, tc.method, tc.target, tc.body)
			require.Equal(t, http.StatusBadRequest, rec.Code, rec.Body.String())
			require.Equal(t, adminguard.TypeValidation, a.Type)
			if tc.field == "" {
				tc.field = "body"
			}
			require.Equal(t, tc.field, a.Field)
			require.Len(t, a.Errors, 1)
			require.Equal(t, tc.field, a.Errors[0].Field)
			require.True(t, strings.HasPrefix(a.Detail, tc.field+" "), a.Detail)
			require.Contains(t, a.Detail, tc.message)
			require.Equal(t, "untouched", string(*seen), "the handler did not run")
		})
	}
}

// TestMiddlewarePasses: ordinary input, a payload with escapes a text may
// hold, and a body the handler must see whole.
func TestMiddlewarePasses(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ method, target, body string }{
		"Query":              {"GET", "/events/parked?type=order.placed&aggregate=%C3%A9t%C3%A9&since=2h", ""},
		"PayloadNewline":     {"POST", "/events/e1/repair", `{"payload":{"note":"line 1\nline 2\t\u001b"},"schema_version":1,"reason":"fix the note"}`},
		"PayloadString":      {"POST", "/events/e1/repair", `{"payload":"a\nb","reason":"x"}`},
		"ReasonAtLimit":      {"POST", "/replays", `{"reason":"` + strings.Repeat("é", adminguard.MaxReasonChars) + `"}`},
		"NotJSON":            {"POST", "/replays", `reason=x`},
		"NotJSONAfterObject": {"POST", "/replays", `{"reason":"x"} trailing`},
		"NestedReasonLong":   {"POST", "/replays", `{"x":{"reason":"` + strings.Repeat("a", 2000) + `"}}`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h, seen := guarded(t)
			rec, _ := serve(t, h, tc.method, tc.target, tc.body)
			require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
			require.Equal(t, tc.body, string(*seen), "the handler reads the body as it came")
		})
	}
}

// TestMiddlewareCleanPaths: a path a router would clean answers 404 and
// never redirects, so /admin/events/../stats cannot become /stats.
func TestMiddlewareCleanPaths(t *testing.T) {
	t.Parallel()
	h, _ := guarded(t)
	for _, target := range []string{"/events/../stats", "/events/%2e%2e/stats", "/events/./parked", "//stats", "/events//parked", "/stats/.."} {
		rec, a := serve(t, h, "GET", target, "")
		require.Equal(t, http.StatusNotFound, rec.Code, target)
		require.Empty(t, rec.Header().Get("Location"), target)
		require.Contains(t, a.Detail, `".."`, target)
	}
	req := httptest.NewRequest("GET", "/stats", nil)
	req.URL.Path, req.URL.RawPath = "", ""
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusNotFound, rec.Code, "the bare prefix (/admin stripped to nothing) is not redirected to /")
	require.Empty(t, rec.Header().Get("Location"))
}

// TestMiddlewareBoundsBody: a body over the limit is 413 and is not read
// past limit+1 bytes.
func TestMiddlewareBoundsBody(t *testing.T) {
	t.Parallel()
	h, _ := guarded(t)
	rec, a := serve(t, h, "POST", "/replays", `{"reason":"`+strings.Repeat("a", 5000)+`"}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
	require.Contains(t, a.Detail, "4096 bytes")
}

func TestCheckReason(t *testing.T) {
	t.Parallel()
	require.NoError(t, adminguard.CheckReason(""), "whether a reason is required is the endpoint's to say")
	require.NoError(t, adminguard.CheckReason("incident 42: broker lost the partition"))
	require.NoError(t, adminguard.CheckReason(strings.Repeat("日", adminguard.MaxReasonChars)), "characters, not bytes")
	err := adminguard.CheckReason(strings.Repeat("a", 2000))
	require.EqualError(t, err, "reason must be at most 1024 characters (it has 2000)")
	require.EqualError(t, adminguard.CheckReason("x\napproved by ops2"), "reason must not contain control characters (found U+000A)")
	require.EqualError(t, adminguard.CheckReason("a\xffb"), "reason must be valid UTF-8")
	var fe *adminguard.FieldError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "reason", fe.Field)
}

func TestPrintable(t *testing.T) {
	t.Parallel()
	require.Equal(t, "plain ünïcode", adminguard.Printable("plain ünïcode"))
	require.Equal(t, `ok\rrewritten`, adminguard.Printable("ok\rrewritten"))
	require.Equal(t, `\x1b[2Kclean`, adminguard.Printable("\x1b[2Kclean"))
	require.Equal(t, `x\napproved by ops2`, adminguard.Printable("x\napproved by ops2"))
	require.Equal(t, `a\x00b\xffc\u202e`, adminguard.Printable("a\x00b\xffc\u202e"))
}

// FuzzAdminInput drives the guard with any path, query and body. It must
// never panic or answer 5xx; a refusal is a problem document; and what it
// lets through keeps the rule: the path and query values are valid UTF-8
// without control characters, the body reaches the handler unchanged,
// and a JSON body is valid UTF-8, without NUL anywhere and without control
// characters outside the payload. Run with
// go test -fuzz=FuzzAdminInput ./internal/outbox/adminguard.
func FuzzAdminInput(f *testing.F) {
	f.Add("/events/parked", "type=%00", []byte(nil))
	f.Add("/events/parked", "type=%ff%fe&aggregate=x", []byte(nil))
	f.Add("/events/\x00", "", []byte(nil))
	f.Add("/events/../stats", "", []byte(nil))
	f.Add("/events/e1/repair", "", []byte(`{"payload":{"a":"b\nc"},"schema_version":1,"reason":"fix"}`))
	f.Add("/replays", "", []byte(`{"ids":["\u0000"],"reason":"x\napproved by ops2"}`))
	f.Add("/replays", "", []byte("{\"reason\":\"\xff\"}"))
	f.Add("/publish-modes/order.placed", "", []byte(`{"mode":"shadow","reason":"\u001b[2K"}`))
	h, seen := guarded(f, "/") // every path reaches a handler unless refused
	f.Fuzz(func(t *testing.T, path, query string, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "/replays", nil)
		req.URL = &url.URL{Path: path, RawQuery: query}
		req.Body = io.NopCloser(strings.NewReader(string(body)))
		*seen = nil
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("status %d for %q ? %q body %q", rec.Code, path, query, body)
		}
		if rec.Code >= 400 && rec.Code != http.StatusMethodNotAllowed && rec.Header().Get("Content-Type") != "text/plain; charset=utf-8" {
			var a answer
			require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &a))
			require.Equal(t, rec.Code, a.Status)
			if rec.Code == http.StatusBadRequest {
				require.NotEmpty(t, a.Field)
				require.True(t, utf8.ValidString(a.Field) && adminguard.CheckText("field", a.Field) == nil, "the field name prints safely: %q", a.Field)
			}
		}
		if *seen == nil {
			return // refused, or not routed to a handler
		}
		require.Equal(t, string(body), string(*seen), "the handler reads the body as it came")
		require.NoError(t, adminguard.CheckText("path", path))
		q, err := url.ParseQuery(query)
		require.NoError(t, err)
		for k, vs := range q {
			require.NoError(t, adminguard.CheckText("query", k))
			for _, v := range vs {
				require.NoError(t, adminguard.CheckText(k, v))
			}
		}
		var doc any
		if json.Unmarshal(body, &doc) != nil {
			return // not JSON: the handler refuses it
		}
		require.True(t, utf8.Valid(body))
		if top, ok := doc.(map[string]any); ok {
			for k, v := range top {
				walk(t, k, false)
				walk(t, v, k == "payload")
			}
			return
		}
		walk(t, doc, false)
	})
}

// walk checks a decoded JSON value the way the rule reads, independently
// of the guard's token walk: NUL nowhere, control characters only where
// inPayload.
func walk(t *testing.T, v any, inPayload bool) {
	check := func(s string) {
		require.NotContains(t, s, "\x00")
		if !inPayload {
			require.NoError(t, adminguard.CheckText("x", s))
		}
	}
	switch x := v.(type) {
	case string:
		check(x)
	case []any:
		for _, e := range x {
			walk(t, e, inPayload)
		}
	case map[string]any:
		for k, e := range x {
			check(k)
			walk(t, e, inPayload)
		}
	}
}
