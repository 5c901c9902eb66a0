package auth_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/auth"
)

func TestParseTokens(t *testing.T) {
	t.Parallel()
	tokens, err := auth.ParseTokens(" dev-alice=alice:customer, dev-ops=ops:admin,dev-n=notifier:service ,")
	require.NoError(t, err)
	require.Equal(t, 3, tokens.Len())

	for _, tc := range []struct{ name, spec, want string }{
		{"Empty", "", "no tokens"},
		{"NoRole", "t=alice", "want token=subject:role"},
		{"NoSubject", "t=:admin", "want token=subject:role"},
		{"UnknownRole", "t=alice:root", `unknown role "root"`},
		{"Duplicate", "t=alice:customer,t=bob:customer", "listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := auth.ParseTokens(tc.spec)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "t=", "errors never echo a token")
		})
	}
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	tokens, err := auth.ParseTokens("dev-alice=alice:customer")
	require.NoError(t, err)
	p, ok := tokens.Authenticate("Bearer dev-alice")
	require.True(t, ok)
	require.Equal(t, auth.Principal{Subject: "alice", Role: auth.RoleCustomer}, p)
	_, ok = tokens.Authenticate("bearer dev-alice")
	require.True(t, ok, "the scheme is case-insensitive")
	for _, h := range []string{"", "dev-alice", "Basic dev-alice", "Bearer ", "Bearer dev-alic", "Bearer dev-alice2"} {
		_, ok := tokens.Authenticate(h)
		require.False(t, ok, "header %q", h)
	}

	var seen auth.Principal
	h := tokens.Middleware(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusUnauthorized) })(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen, _ = auth.FromContext(r.Context()) }))
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/", nil)
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	req.Header.Set("Authorization", "Bearer dev-alice")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "alice", seen.Subject)
}

func TestViewerRole(t *testing.T) {
	t.Parallel()
	tokens, err := auth.ParseTokens("dev-view=vera:viewer,dev-ops=ops:admin")
	require.NoError(t, err)
	p, ok := tokens.Lookup(" dev-view ")
	require.True(t, ok)
	require.Equal(t, auth.Principal{Subject: "vera", Role: auth.RoleViewer}, p)
	require.True(t, p.Role.IsOperator())
	require.False(t, p.Role.CanWrite(), "a viewer changes nothing")
	require.True(t, auth.RoleAdmin.CanWrite())
	for _, r := range []auth.Role{auth.RoleCustomer, auth.RoleService} {
		require.False(t, r.IsOperator(), r)
		require.False(t, r.CanWrite(), r)
	}
	_, ok = tokens.Lookup("")
	require.False(t, ok, "an empty token signs nobody in")
}
