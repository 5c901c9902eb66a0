package ordersapi_test

// This file checks real responses against the published API description,
// docs/openapi.yaml, with a maintained OpenAPI validator. Tests in this
// package call checkContract on every response they receive, so the
// document cannot drift away from what the handler actually does without a
// test failing.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/mail"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	validatorerrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/ordersapi"
)

// openAPIPath is the API description, relative to this package's directory
// (go test runs tests there).
var openAPIPath = filepath.Join("..", "..", "docs", "openapi.yaml")

// contract holds the document and its validator, built once per test
// binary: building compiles every schema, which is too slow to repeat for
// each response. The validator is safe for concurrent use, so parallel
// tests share it.
var contract struct {
	once      sync.Once
	doc       libopenapi.Document
	model     *v3.Document
	validator validator.Validator
	err       error
}

// validatorOptions turn on format checks (uuid, date-time, email, uri),
// which the library leaves off by default; without them a malformed id or
// timestamp would pass.
//
// "email" is checked with the rule the API itself applies (a bare RFC 5322
// address as net/mail parses it), not the validator's built-in one, which
// rejects some addresses the API accepts (non-ASCII local parts, labels
// over 63 characters) and would flag correct responses.
func validatorOptions() []config.Option {
	return []config.Option{
		config.WithFormatAssertions(),
		config.WithCustomFormat("email", func(v any) error {
			s, ok := v.(string)
			if !ok {
				return nil // other types are the schema's "type" keyword's business
			}
			if a, err := mail.ParseAddress(s); err != nil || a.Address != s {
				return fmt.Errorf("%q is not a bare RFC 5322 address", s)
			}
			return nil
		}),
	}
}

func loadContract() (validator.Validator, error) {
	contract.once.Do(func() {
		spec, err := os.ReadFile(openAPIPath)
		if err != nil {
			contract.err = fmt.Errorf("read API description: %w", err)
			return
		}
		doc, err := libopenapi.NewDocument(spec)
		if err != nil {
			contract.err = fmt.Errorf("parse %s: %w", openAPIPath, err)
			return
		}
		m, err := doc.BuildV3Model()
		if err != nil {
			contract.err = fmt.Errorf("build %s as OpenAPI 3: %w", openAPIPath, err)
			return
		}
		contract.doc, contract.model = doc, &m.Model
		v, errs := validator.NewValidator(doc, validatorOptions()...)
		if len(errs) > 0 {
			contract.err = fmt.Errorf("build validator for %s: %v", openAPIPath, errs)
			return
		}
		contract.validator = v
	})
	return contract.validator, contract.err
}

// checkContract fails the test (with t.Errorf, so it may be called from any
// goroutine) unless res, whose body the caller already read into body,
// matches docs/openapi.yaml for req's method and path: a documented status
// code, the documented content type, a body that validates against the
// schema, and every required response header with a valid value. res.Body
// is restored from body, so the caller may read it again.
func checkContract(t *testing.T, req *http.Request, res *http.Response, body []byte) {
	t.Helper()
	res.Body = io.NopCloser(bytes.NewReader(body))
	problems := contractErrors(req, res, body)
	if len(problems) == 0 {
		return
	}
	t.Errorf("%s %s: response %d does not match %s:\n  - %s\nbody: %s",
		req.Method, req.URL.Path, res.StatusCode, openAPIPath, strings.Join(problems, "\n  - "), truncate(body, 2000))
}

// contractErrors returns one line per way in which the response differs
// from the document, or nil when it matches. It never touches the caller's
// request body (response validation only needs the method, path and
// headers) and reads the response body from body, not from res.Body.
func contractErrors(req *http.Request, res *http.Response, body []byte) []string {
	v, err := loadContract()
	if err != nil {
		return []string{err.Error()}
	}
	// Work on copies: the request's body may already be consumed (or be
	// read concurrently by a transport), and the validator reads the
	// response body to the end.
	rq := req.Clone(req.Context())
	rq.Body, rq.GetBody, rq.ContentLength = http.NoBody, nil, 0
	rs := *res
	rs.Header = res.Header.Clone()
	rs.Body = io.NopCloser(bytes.NewReader(body))
	rs.Request = rq

	ok, verrs := v.ValidateHttpResponse(rq, &rs)
	if ok && len(verrs) == 0 {
		return nil
	}
	out := make([]string, 0, len(verrs))
	for _, e := range verrs {
		out = append(out, describe(e)...)
	}
	if len(out) == 0 {
		out = append(out, "the validator rejected the response without saying why")
	}
	return out
}

// describe turns one validation error into readable lines: the message and
// reason, then each schema failure with the field it concerns.
func describe(e *validatorerrors.ValidationError) []string {
	head := e.Message
	if e.Reason != "" && e.Reason != e.Message {
		head += ": " + e.Reason
	}
	if len(e.SchemaValidationErrors) == 0 {
		return []string{head}
	}
	lines := []string{head}
	for _, f := range e.SchemaValidationErrors {
		where := f.FieldPath
		if where == "" {
			where = "/" + strings.Join(f.InstancePath, "/")
		}
		lines = append(lines, fmt.Sprintf("    %s: %s (schema %s)", where, f.Reason, f.KeywordLocation))
	}
	return lines
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}

// TestOpenAPIDocumentIsValid checks that docs/openapi.yaml is an OpenAPI
// 3.1 document that parses, builds into a model without errors, and
// validates against the OpenAPI 3.1 specification's own schema.
func TestOpenAPIDocumentIsValid(t *testing.T) {
	t.Parallel()
	v, err := loadContract()
	require.NoError(t, err)

	info := contract.doc.GetSpecInfo()
	require.True(t, strings.HasPrefix(info.Version, "3.1."), "openapi version is %q, want 3.1.x", info.Version)

	ok, errs := v.ValidateDocument()
	var lines []string
	for _, e := range errs {
		lines = append(lines, describe(e)...)
	}
	require.True(t, ok && len(errs) == 0, "%s is not a valid OpenAPI 3.1 document:\n%s", openAPIPath, strings.Join(lines, "\n"))
}

// TestOpenAPIExamplesMatchSchemas validates every request and response
// example in the document against its schema, so the examples readers copy
// are themselves correct.
func TestOpenAPIExamplesMatchSchemas(t *testing.T) {
	t.Parallel()
	_, err := loadContract()
	require.NoError(t, err)

	sv := schema_validation.NewSchemaValidator(validatorOptions()...)
	version := contract.doc.GetSpecInfo().VersionNumeric
	checked := 0
	check := func(where string, mt *v3.MediaType) {
		if mt == nil || mt.Schema == nil {
			return
		}
		schema := mt.Schema.Schema()
		require.NotNil(t, schema, "%s: schema does not resolve", where)
		var values []namedExample
		if mt.Example != nil {
			values = append(values, namedExample{"example", mt.Example})
		}
		if mt.Examples != nil {
			for name, ex := range mt.Examples.FromOldest() {
				if ex != nil && ex.Value != nil {
					values = append(values, namedExample{"examples." + name, ex.Value})
				}
			}
		}
		for _, ex := range values {
			var value any
			require.NoError(t, ex.node.Decode(&value), "%s %s: decode", where, ex.name)
			ok, errs := sv.ValidateSchemaObjectWithVersion(schema, value, version)
			var lines []string
			for _, e := range errs {
				lines = append(lines, describe(e)...)
			}
			if !ok {
				t.Errorf("%s %s does not match its schema:\n%s", where, ex.name, strings.Join(lines, "\n"))
			}
			checked++
		}
	}
	for path, item := range contract.model.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			where := strings.ToUpper(method) + " " + path
			if op.RequestBody != nil && op.RequestBody.Content != nil {
				for ct, mt := range op.RequestBody.Content.FromOldest() {
					check(where+" request "+ct, mt)
				}
			}
			for code, resp := range op.Responses.Codes.FromOldest() {
				if resp.Content == nil {
					continue
				}
				for ct, mt := range resp.Content.FromOldest() {
					check(fmt.Sprintf("%s %s %s", where, code, ct), mt)
				}
			}
		}
	}
	require.Greater(t, checked, 20, "suspiciously few examples were found; is the walk broken?")
}

// namedExample is one example value of a media type, still as YAML.
type namedExample struct {
	name string
	node interface{ Decode(any) error }
}

// TestOpenAPIDocumentsEveryRoute compares the router's routes with the
// document's operations in both directions: an undocumented route and a
// documented operation that no longer exists both fail.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	t.Parallel()
	_, err := loadContract()
	require.NoError(t, err)

	tokens, err := auth.ParseTokens("dev-alice=alice:customer")
	require.NoError(t, err)
	// Routing needs no database: the service is never called here.
	h := ordersapi.New(ordersapi.Config{Tokens: tokens, Metrics: http.NotFoundHandler()})
	routes, ok := h.(chi.Routes)
	require.True(t, ok, "ordersapi.New no longer returns a chi router; update this test")

	var served []string
	require.NoError(t, chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		served = append(served, method+" "+route)
		return nil
	}))
	var documented []string
	for path, item := range contract.model.Paths.PathItems.FromOldest() {
		for method := range item.GetOperations().FromOldest() {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	slices.Sort(served)
	slices.Sort(documented)
	require.Equal(t, served, documented, "routes served by ordersapi.New and operations in %s differ", openAPIPath)
}

// TestContractCatchesWrongResponses proves the helper is not a rubber
// stamp: it accepts a response that follows the document and reports each
// kind of deviation. It calls contractErrors rather than checkContract so
// that the expected failures do not fail this test.
func TestContractCatchesWrongResponses(t *testing.T) {
	t.Parallel()
	const id = "01a22bbc-7a6b-7d2e-9f1a-3b6c8d0e2f41"
	goodOrder := map[string]any{
		"id": id, "customer": "alice", "email": "alice@example.com", "currency": "EUR",
		"items":       []map[string]any{{"sku": "BOOK-42", "quantity": 2, "unit_price_cents": 1250}},
		"total_cents": 2500, "status": "placed", "version": 1,
		"created_at": "2026-11-30T09:15:02.123456Z", "updated_at": "2026-11-30T09:15:02.123456Z",
	}
	goodHeaders := func() http.Header {
		return http.Header{
			"Content-Type":  {"application/json"},
			"Etag":          {`"1"`},
			"Location":      {"/orders/" + id},
			"X-Request-Id":  {"host/abc-000001"},
			"Cache-Control": {"no-store"},
		}
	}
	createReq := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"email":"alice@example.com"}`))
		_, _ = io.ReadAll(r.Body) // as after a real round trip: the body is gone
		return r
	}
	response := func(status int, h http.Header, body any) (*http.Response, []byte) {
		b, ok := body.([]byte)
		if !ok {
			var err error
			b, err = json.Marshal(body)
			require.NoError(t, err)
		}
		return &http.Response{StatusCode: status, Header: h, Body: http.NoBody}, b
	}
	without := func(m map[string]any, keys ...string) map[string]any {
		out := map[string]any{}
		for k, v := range m {
			if !slices.Contains(keys, k) {
				out[k] = v
			}
		}
		return out
	}
	with := func(m map[string]any, k string, v any) map[string]any {
		out := without(m, k)
		out[k] = v
		return out
	}

	t.Run("AcceptsConformingResponse", func(t *testing.T) {
		t.Parallel()
		res, body := response(http.StatusCreated, goodHeaders(), goodOrder)
		require.Empty(t, contractErrors(createReq(), res, body))
	})

	cases := []struct {
		name    string
		status  int
		header  func(http.Header)
		body    any
		mention string // a fragment the report must contain
	}{
		{name: "MissingRequiredFields", status: http.StatusCreated, body: without(goodOrder, "id", "version", "total_cents"), mention: "version"},
		{name: "WrongFieldType", status: http.StatusCreated, body: with(goodOrder, "version", "1"), mention: "version"},
		{name: "MalformedUUID", status: http.StatusCreated, body: with(goodOrder, "id", "order-1"), mention: "uuid"},
		{name: "UnknownStatusValue", status: http.StatusCreated, body: with(goodOrder, "status", "lost"), mention: "status"},
		{name: "UndocumentedField", status: http.StatusCreated, body: with(goodOrder, "internal_note", "x"), mention: "internal_note"},
		{name: "MissingETag", status: http.StatusCreated, header: func(h http.Header) { h.Del("Etag") }, body: goodOrder, mention: "ETag"},
		{name: "UnquotedETag", status: http.StatusCreated, header: func(h http.Header) { h.Set("Etag", "1") }, body: goodOrder, mention: "ETag"},
		{name: "MissingLocation", status: http.StatusCreated, header: func(h http.Header) { h.Del("Location") }, body: goodOrder, mention: "Location"},
		{name: "WrongContentType", status: http.StatusCreated, header: func(h http.Header) { h.Set("Content-Type", "text/plain") }, body: goodOrder, mention: "text/plain"},
		{name: "NotJSON", status: http.StatusCreated, body: []byte("{not json"), mention: "decode"},
		{name: "UndocumentedStatus", status: http.StatusTeapot, body: goodOrder, mention: "418"},
		{name: "ProblemWithoutProblemType", status: http.StatusUnauthorized,
			header: func(h http.Header) {
				h.Set("Content-Type", "application/problem+json")
				h.Set("WWW-Authenticate", `Bearer realm="orders"`)
			},
			body: map[string]any{"title": "Unauthorized", "status": 401}, mention: "type"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := goodHeaders()
			if tc.header != nil {
				tc.header(h)
			}
			res, body := response(tc.status, h, tc.body)
			problems := contractErrors(createReq(), res, body)
			require.NotEmpty(t, problems, "the validator accepted a wrong response")
			require.Contains(t, strings.ToLower(strings.Join(problems, "\n")), strings.ToLower(tc.mention),
				"the report does not name what is wrong")
		})
	}
}
