// Package auth authenticates bearer tokens against a static token table.
//
// The table comes from configuration (AUTH_TOKENS) as a comma-separated list
// of token=subject:role entries. Tokens are kept only as SHA-256 digests, so
// a lookup's timing does not depend on how much of a guessed token matches.
package auth

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"strings"
)

// Role is what a principal may do.
type Role string

// The roles of the order API (S1).
const (
	// RoleCustomer sees and changes only its own orders.
	RoleCustomer Role = "customer"
	// RoleAdmin reads any order and may ship.
	RoleAdmin Role = "admin"
	// RoleService reads any order, for the notifier's resynchronisation.
	RoleService Role = "service"
	// RoleViewer is an operator who looks and changes nothing: it reads
	// the operator console's pages and the admin API's reports, and is
	// refused every write there and the whole order API.
	RoleViewer Role = "viewer"
)

// CanWrite reports whether the role may use the operations' writes
// (repair, resume, replay, resolve): only an admin may.
func (r Role) CanWrite() bool { return r == RoleAdmin }

// IsOperator reports whether the role may read the operations: an admin
// or a viewer.
func (r Role) IsOperator() bool { return r == RoleAdmin || r == RoleViewer }

// Principal is the authenticated caller.
type Principal struct {
	Subject string
	Role    Role
}

// Tokens maps token digests to principals.
type Tokens struct {
	byDigest map[[32]byte]Principal
}

// ParseTokens parses "token=subject:role,...". It refuses empty tokens,
// unknown roles and a token listed twice.
func ParseTokens(spec string) (*Tokens, error) {
	t := &Tokens{byDigest: map[[32]byte]Principal{}}
	for i, entry := range strings.Split(spec, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		token, rest, ok := strings.Cut(entry, "=")
		subject, role, ok2 := strings.Cut(rest, ":")
		if !ok || !ok2 || token == "" || subject == "" {
			return nil, fmt.Errorf("entry %d: want token=subject:role", i+1)
		}
		switch Role(role) {
		case RoleCustomer, RoleAdmin, RoleService, RoleViewer:
		default:
			return nil, fmt.Errorf("entry %d (subject %q): unknown role %q (want customer, admin, service or viewer)", i+1, subject, role)
		}
		d := sha256.Sum256([]byte(token))
		if _, dup := t.byDigest[d]; dup {
			return nil, fmt.Errorf("entry %d (subject %q): token listed twice", i+1, subject)
		}
		t.byDigest[d] = Principal{Subject: subject, Role: Role(role)}
	}
	if len(t.byDigest) == 0 {
		return nil, fmt.Errorf("no tokens configured")
	}
	return t, nil
}

// Len returns the number of configured tokens.
func (t *Tokens) Len() int { return len(t.byDigest) }

// Subjects lists "subject:role" for each token, for printing the
// configuration without the secrets.
func (t *Tokens) Subjects() []string {
	out := make([]string, 0, len(t.byDigest))
	for _, p := range t.byDigest {
		out = append(out, p.Subject+":"+string(p.Role))
	}
	return out
}

// Authenticate returns the principal of an "Authorization: Bearer" header.
func (t *Tokens) Authenticate(header string) (Principal, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return Principal{}, false
	}
	return t.Lookup(token)
}

// Lookup returns the principal of a raw token, such as one typed into a
// sign-in form.
func (t *Tokens) Lookup(token string) (Principal, bool) {
	token = strings.TrimSpace(token)
	if token == "" {
		return Principal{}, false
	}
	p, ok := t.byDigest[sha256.Sum256([]byte(token))]
	return p, ok
}

type ctxKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// FromContext returns the principal stored by Middleware.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(ctxKey{}).(Principal)
	return p, ok
}

// Middleware authenticates every request, calling unauthorized for a
// missing or unknown token.
func (t *Tokens) Middleware(unauthorized http.HandlerFunc) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p, ok := t.Authenticate(r.Header.Get("Authorization"))
			if !ok {
				unauthorized(w, r)
				return
			}
			next.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), p)))
		})
	}
}
