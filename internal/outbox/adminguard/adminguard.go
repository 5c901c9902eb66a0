// Package adminguard checks the input of an operator's HTTP API at its
// edge, before a handler sees it, with one rule for every service of the
// module: the outbox's operations (orders) and the notifier's admin API.
//
// It closes the window between "text an operator (or a stolen admin
// token) sends" and "text the database stores and a terminal prints". A
// NUL or a byte sequence that is not UTF-8 reaches PostgreSQL, which
// refuses it: the caller got a 500 for its own mistake. A control
// character reaches the audit trail, where "\r" or "ESC[2K" rewrites the
// line a later `admin show` prints and "\napproved by ops2" forges one.
// Here both become a 400 problem naming the field, and nothing is stored.
//
// The rule, per kind of input:
//
//   - Path segments, query parameter names and values, JSON object keys
//     and JSON string values (at any depth) are identifiers, types or
//     short text: valid UTF-8 and no control character (see IsControl).
//   - The top-level "reason" field is the audit reason: the same, and at
//     most MaxReasonChars characters (CheckReason). It is refused, never
//     cut: a reason that loses its end may lose its meaning.
//   - The fields a service names in Config.Payload carry a document of its
//     own (an event payload under repair). Inside them a control character
//     is a legitimate JSON escape ("\n" in a text field), so they need only
//     be valid UTF-8 without NUL (U+0000), which PostgreSQL jsonb cannot
//     store.
//   - A path with an empty, "." or ".." segment answers 404: a router
//     would clean it into another route, and a redirect to the cleaned
//     path leaves the prefix the API is mounted under (/admin/events/../stats
//     would become /stats).
//
// Its refusals are written by outbox/problem, the module's one problem
// writer. The package imports only the standard library and that sibling,
// so the outbox, which a service copies with `cp -r`, keeps it with it
// (L1); the notifier imports it from here, as it imports outbox/cloudevents.
package adminguard

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/outboxref/orders/internal/outbox/problem"
)

// MaxReasonChars bounds an audit reason, in characters: the CHECK on the
// reason column of both services' audit tables.
const MaxReasonChars = 1024

// DefaultMaxBodyBytes bounds a request body when Config.MaxBodyBytes is 0.
const DefaultMaxBodyBytes = 64 << 10

// TypeValidation is the problem type of a refused input (RFC 9457): the
// same URI as the services' other field validation failures.
const TypeValidation = "urn:outboxref:problem:validation"

// FieldError says which field of a request breaks the rule, and how. Its
// Error reads as one sentence: "reason must not contain control
// characters (found U+000A)".
type FieldError struct {
	// Field names the input: a path wildcard ("id"), a query parameter
	// ("type"), or a JSON field as a path ("reason", "payload.items[0].sku",
	// with a key that is not a plain name quoted: `payload["a\x00"]`).
	// It never holds a control character itself.
	Field   string
	Message string
}

func (e *FieldError) Error() string { return e.Field + " " + e.Message }

// IsControl reports whether r may not appear in an identifier or a
// reason: the C0 and C1 controls and DEL (unicode.IsControl), the line and
// paragraph separators, which end a line as "\n" does, and the
// bidirectional embedding, override and isolate controls, which reorder
// what a terminal shows ("Trojan Source").
func IsControl(r rune) bool {
	return unicode.IsControl(r) || r == '\u2028' || r == '\u2029' ||
		(r >= '\u202a' && r <= '\u202e') || (r >= '\u2066' && r <= '\u2069')
}

// CheckText returns a *FieldError for field unless s is valid UTF-8
// without control characters: the rule of identifiers, types and short
// text.
func CheckText(field, s string) error {
	if fe := checkText(field, s); fe != nil {
		return fe
	}
	return nil
}

func checkText(field, s string) *FieldError {
	if !utf8.ValidString(s) {
		return &FieldError{Field: field, Message: "must be valid UTF-8"}
	}
	if i := strings.IndexFunc(s, IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(s[i:])
		return &FieldError{Field: field, Message: fmt.Sprintf("must not contain control characters (found %U)", r)}
	}
	return nil
}

// CheckReason returns a *FieldError for the field "reason" unless reason
// is text (CheckText) of at most MaxReasonChars characters. An empty
// reason passes: whether one is required is the endpoint's to say. The
// admin CLIs call it on --reason before sending, so the operator reads the
// same words as from the server.
func CheckReason(reason string) error {
	if fe := checkText("reason", reason); fe != nil {
		return fe
	}
	if n := utf8.RuneCountInString(reason); n > MaxReasonChars {
		return &FieldError{Field: "reason", Message: fmt.Sprintf("must be at most %d characters (it has %d)", MaxReasonChars, n)}
	}
	return nil
}

// checkPayload is the rule inside a payload field: valid UTF-8 (checked
// on the raw body before decoding) and no NUL.
func checkPayload(field, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return &FieldError{Field: field, Message: `must not contain NUL (\u0000): PostgreSQL jsonb cannot store it`}
	}
	return nil
}

// Printable returns s with every control character (IsControl) and every
// byte that is not UTF-8 written as a Go escape (\n, \x1b, \u202e, \xff),
// so text from a server or a database prints as one inert line. The admin
// CLIs pass every string they print through it.
func Printable(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, IsControl) < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case IsControl(r):
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// Config is what Middleware needs to know of the API it guards.
type Config struct {
	// MaxBodyBytes bounds a request body: a larger one answers 413 before
	// it is read further. Zero means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Payload names the top-level JSON fields whose value is a document
	// of the service's own, checked only for UTF-8 and NUL.
	Payload []string
	// Pattern, if set, returns the route pattern the request matches
	// ("POST /events/{id}/repair", "/admin/emails/{operation_key}/resolve"),
	// so a bad path segment is named after its wildcard. Without it, or
	// when the segment is not a wildcard, the field is "path".
	Pattern func(*http.Request) string
}

// Middleware returns a middleware that answers a request breaking the rule
// (see the package doc) with a problem, and hands any other to next with
// its body as it came (it reads the body, bounded, and puts it back).
func Middleware(cfg Config) func(http.Handler) http.Handler {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	payload := make(map[string]bool, len(cfg.Payload))
	for _, f := range cfg.Payload {
		payload[f] = true
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			segments, ok := pathSegments(r.URL)
			if !ok {
				writeProblem(w, http.StatusNotFound, problem.TypeBlank, "no such resource: the path has an empty, \".\" or \"..\" segment", nil)
				return
			}
			if err := checkPath(r, segments, cfg.Pattern); err != nil {
				refuse(w, err)
				return
			}
			if err := checkQuery(r.URL.RawQuery); err != nil {
				refuse(w, err)
				return
			}
			if r.Body != nil && r.Body != http.NoBody {
				body, err := io.ReadAll(io.LimitReader(r.Body, cfg.MaxBodyBytes+1))
				_ = r.Body.Close()
				switch {
				case err != nil:
					writeProblem(w, http.StatusBadRequest, problem.TypeBlank, "the body could not be read", nil)
					return
				case int64(len(body)) > cfg.MaxBodyBytes:
					writeProblem(w, http.StatusRequestEntityTooLarge, problem.TypeBlank, fmt.Sprintf("the body exceeds %d bytes", cfg.MaxBodyBytes), nil)
					return
				}
				if err := CheckJSON(body, payload); err != nil {
					refuse(w, err)
					return
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
				r.ContentLength = int64(len(body))
			}
			next.ServeHTTP(w, r)
		})
	}
}

// pathSegments splits the escaped path into its decoded segments, the
// first being the empty one before the leading slash. It reports false for
// a path a router would clean: not absolute, or with an empty, "." or
// ".." segment (a trailing slash is fine: routers do not clean it away).
// Segments are split before decoding, so an escaped slash (%2F) stays in
// its segment, as routers see it.
func pathSegments(u *url.URL) ([]string, bool) {
	raw := strings.Split(u.EscapedPath(), "/")
	if len(raw) < 2 || raw[0] != "" {
		return nil, false
	}
	segments := make([]string, len(raw))
	for i, s := range raw {
		d, err := url.PathUnescape(s)
		if err != nil {
			d = s // EscapedPath escapes what it decoded: cannot happen
		}
		if i > 0 && (d == "." || d == ".." || (d == "" && i != len(raw)-1)) {
			return nil, false
		}
		segments[i] = d
	}
	return segments, true
}

func checkPath(r *http.Request, segments []string, pattern func(*http.Request) string) error {
	for i, s := range segments {
		if fe := checkText("path", s); fe != nil {
			fe.Field = wildcard(r, pattern, i)
			return fe
		}
	}
	return nil
}

// wildcard names segment i of the request's path after the wildcard of
// its route pattern in the same place ("{id}" gives "id"), else "path".
func wildcard(r *http.Request, pattern func(*http.Request) string, i int) string {
	if pattern == nil {
		return "path"
	}
	p := pattern(r)
	if _, rest, ok := strings.Cut(p, " "); ok { // "POST /x/{id}": drop the method
		p = rest
	}
	if j := strings.IndexByte(p, '/'); j > 0 { // a host pattern: "example.com/x"
		p = p[j:]
	}
	parts := strings.Split(p, "/")
	if i >= len(parts) {
		return "path"
	}
	name, ok := strings.CutPrefix(parts[i], "{")
	if name, ok = strings.CutSuffix(name, "}"); !ok {
		return "path"
	}
	name = strings.TrimSuffix(name, "...") // ServeMux: {rest...}
	name, _, _ = strings.Cut(name, ":")    // chi: {id:[0-9]+}
	if name == "" || name == "$" || !plainName.MatchString(name) {
		return "path"
	}
	return name
}

// checkQuery parses the query itself: url.Values drops what it cannot
// parse, which would hide a bad escape from the check.
func checkQuery(raw string) error {
	if raw == "" {
		return nil
	}
	q, err := url.ParseQuery(raw)
	if err != nil {
		return &FieldError{Field: "query", Message: "must be a valid URL query (key=value pairs joined by &)"}
	}
	for k, vs := range q {
		if fe := checkText("query", k); fe != nil {
			fe.Message = "parameter names " + fe.Message
			return fe
		}
		field := k
		if field == "" {
			field = "query" // "?=x": a value without a name
		}
		for _, v := range vs {
			if fe := checkText(field, v); fe != nil {
				return fe
			}
		}
	}
	return nil
}

// CheckJSON applies the rule to a JSON body: every key and string value,
// at any depth, with the payload rule under the top-level fields in
// payload and the reason rule for the top-level "reason". A body that is
// not JSON passes: the handler's decoder answers it with its own words.
//
// The raw bytes are checked for UTF-8 first: encoding/json replaces a
// byte that is not UTF-8 by U+FFFD without a word, so after decoding the
// fault cannot be seen.
func CheckJSON(body []byte, payload map[string]bool) error {
	bad := -1
	if !utf8.Valid(body) {
		bad = firstInvalid(body)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var stack []frame
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			if bad >= 0 {
				return &FieldError{Field: "body", Message: "must be valid UTF-8"}
			}
			return nil // the end, or not JSON: the handler's to answer
		}
		end := dec.InputOffset()
		n := len(stack)
		isKey := n > 0 && stack[n-1].obj && stack[n-1].wantKey
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = valueDone(stack[:n-1])
			continue
		}
		if n > 0 && !stack[n-1].obj {
			stack[n-1].idx++
		}
		if isKey {
			key := tok.(string) // the decoder allows only strings here
			stack[n-1].key, stack[n-1].wantKey = key, false
			if err := checkString(stack, key, true, bad, start, end, payload); err != nil {
				return err
			}
			continue
		}
		switch t := tok.(type) {
		case json.Delim: // '{' or '['
			stack = append(stack, frame{obj: t == '{', wantKey: t == '{', idx: -1})
			continue
		case string:
			if err := checkString(stack, t, false, bad, start, end, payload); err != nil {
				return err
			}
		}
		stack = valueDone(stack)
	}
}

// frame is one open object or array of CheckJSON's walk.
type frame struct {
	obj     bool
	wantKey bool   // an object's next token is a key
	key     string // an object's current key
	idx     int    // an array's current index
}

// valueDone marks the value of the innermost container as complete.
func valueDone(stack []frame) []frame {
	if n := len(stack); n > 0 && stack[n-1].obj {
		stack[n-1].wantKey = true
	}
	return stack
}

// checkString applies the rule of its place to s, a key (isKey) or a
// string value whose token spans body[start:end]; bad is the offset of the
// body's first byte that is not UTF-8, or -1.
func checkString(stack []frame, s string, isKey bool, bad int, start, end int64, payload map[string]bool) error {
	field := fieldPath(stack)
	if bad >= 0 && int64(bad) >= start && int64(bad) < end {
		return &FieldError{Field: field, Message: "must be valid UTF-8"}
	}
	inPayload := len(stack) > 0 && stack[0].obj && payload[stack[0].key] && (len(stack) > 1 || !isKey)
	switch {
	case inPayload:
		return checkPayload(field, s)
	case len(stack) == 1 && stack[0].obj && !isKey && stack[0].key == "reason":
		return CheckReason(s)
	default:
		return CheckText(field, s)
	}
}

// plainName is a key that needs no quoting in a field path.
var plainName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// fieldPath names the innermost open value: "reason", "ids[2]",
// "payload.items[0].sku", with a key that is not a plain name quoted in
// brackets (`payload["a\x00b"]`), so the name itself prints safely.
func fieldPath(stack []frame) string {
	var b strings.Builder
	for _, f := range stack {
		switch {
		case !f.obj:
			fmt.Fprintf(&b, "[%d]", f.idx)
		case plainName.MatchString(f.key):
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(f.key)
		default:
			b.WriteString("[" + strconv.QuoteToASCII(f.key) + "]")
		}
	}
	if b.Len() == 0 {
		return "body"
	}
	return b.String()
}

// firstInvalid returns the offset of the first byte of b that does not
// start a valid UTF-8 sequence.
func firstInvalid(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}

func refuse(w http.ResponseWriter, err error) {
	var fe *FieldError
	if !errors.As(err, &fe) {
		fe = &FieldError{Field: "request", Message: err.Error()}
	}
	writeProblem(w, http.StatusBadRequest, TypeValidation, fe.Error(), fe)
}

// writeProblem answers with a problem document. A refused field is named
// twice: in "errors", as the services' other validation failures list
// theirs, and as the extension member "field", for a client that wants the
// one field without walking a list.
func writeProblem(w http.ResponseWriter, status int, typ, detail string, fe *FieldError) {
	p := problem.Problem{Type: typ, Status: status, Detail: detail}
	if fe != nil {
		p.Title = "Invalid request"
		p.Errors = []problem.FieldError{{Field: fe.Field, Message: fe.Message}}
		p.Extensions = map[string]any{"field": fe.Field}
	}
	problem.Write(w, p)
}
