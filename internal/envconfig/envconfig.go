// Package envconfig reads typed settings from environment variables.
//
// A Reader collects every problem instead of stopping at the first, so a
// service refuses to start with one message listing all invalid settings.
package envconfig

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Reader reads variables through getenv and accumulates parse errors.
type Reader struct {
	getenv func(string) string
	errs   []error
}

// New returns a Reader over getenv (os.Getenv in main, a map in tests).
func New(getenv func(string) string) *Reader { return &Reader{getenv: getenv} }

// Err returns all problems found so far, joined, or nil.
func (r *Reader) Err() error { return errors.Join(r.errs...) }

// Fail records a problem found by the caller's own validation.
func (r *Reader) Fail(format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf(format, args...))
}

// String returns the variable, or def when it is unset or empty.
func (r *Reader) String(name, def string) string {
	if v := strings.TrimSpace(r.getenv(name)); v != "" {
		return v
	}
	return def
}

// List returns a comma-separated variable as trimmed, non-empty items.
func (r *Reader) List(name, def string) []string {
	var out []string
	for _, s := range strings.Split(r.String(name, def), ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Int returns an integer variable within [lo, hi].
func (r *Reader) Int(name string, def, lo, hi int) int {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		r.Fail("%s=%q: want an integer from %d to %d", name, v, lo, hi)
		return def
	}
	return n
}

// Bool returns a boolean variable (true/false/1/0).
func (r *Reader) Bool(name string, def bool) bool {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.Fail("%s=%q: want true or false", name, v)
		return def
	}
	return b
}

// Duration returns a positive Go duration variable ("250ms", "30s", "72h").
func (r *Reader) Duration(name string, def time.Duration) time.Duration {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		r.Fail("%s=%q: want a positive duration such as 500ms, 30s or 72h", name, v)
		return def
	}
	return d
}

// keywordPassword matches the password settings of a keyword/value
// connection string ("host=db password='s e cret'"), quoted or not.
var keywordPassword = regexp.MustCompile(`(?i)\b(\w*password\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)`)

// MaskURL hides the passwords of a connection string for printing. pgx
// takes a password in the URL's userinfo, in a password query parameter,
// or in the keyword/value form, so all three are masked. A URL that does
// not parse is hidden whole: where its password sits cannot be known.
func MaskURL(raw string) string {
	if !strings.Contains(raw, "://") {
		return keywordPassword.ReplaceAllString(raw, "${1}xxxxx")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable URL, hidden)"
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	if q := u.Query(); len(q) > 0 {
		masked := false
		for k := range q {
			if strings.Contains(strings.ToLower(k), "password") {
				q.Set(k, "xxxxx")
				masked = true
			}
		}
		if masked {
			u.RawQuery = q.Encode()
		}
	}
	return u.String()
}

// Mask hides a secret, keeping only whether it is set.
func Mask(secret string) string {
	if secret == "" {
		return ""
	}
	return "xxxxx"
}
