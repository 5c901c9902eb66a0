package main

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServeAdminAPI (S1): `notifier serve` serves the admin API on
// HTTP_ADDR behind bearer tokens (401 without one, 403 for a role other
// than admin, 200 for an admin), while /healthz, /readyz and /metrics stay
// open. Without AUTH_TOKENS the admin API is off (404) and the rest is the
// same. The tokens are printed as subjects and roles, never as secrets.
func TestServeAdminAPI(t *testing.T) {
	t.Parallel()
	w := newServeWorld(t)
	s := startServe(t, w.env(t, map[string]string{"AUTH_TOKENS": "adm-s3cret=ops:admin,cus-s3cret=alice:customer,svc-s3cret=notifier:service"}))
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		require.Equal(t, http.StatusOK, getWith(t, s.base+path, ""), path)
	}
	for token, want := range map[string]int{"": 401, "nope": 401, "cus-s3cret": 403, "svc-s3cret": 403, "adm-s3cret": 200} {
		for _, path := range []string{"/admin/parked", "/admin/conflicts", "/admin/emails?state=failed"} {
			require.Equal(t, want, getWith(t, s.base+path, token), "%s with token %q", path, token)
		}
	}
	// A path a router would clean never leaves /admin by a redirect: it
	// answers 404, with or without a token.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, path := range []string{"/admin/../metrics", "/admin/%2e%2e/healthz", "/admin/parked/../conflicts", "/admin//parked", "/admin/parked/."} {
		for _, token := range []string{"", "adm-s3cret"} {
			req, err := http.NewRequest(http.MethodGet, s.base+path, nil)
			require.NoError(t, err)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			res, err := noRedirect.Do(req)
			require.NoError(t, err)
			res.Body.Close()
			require.Empty(t, res.Header.Get("Location"), "%s with token %q", path, token)
			want := http.StatusNotFound
			if token == "" {
				want = http.StatusUnauthorized
			}
			require.Equal(t, want, res.StatusCode, "%s with token %q", path, token)
		}
	}

	s.stop(t)
	require.Contains(t, s.out.String(), "AUTH_TOKENS=[3 tokens: alice:customer notifier:service ops:admin]")
	require.NotContains(t, s.out.String(), "s3cret")

	off := startServe(t, w.env(t, nil))
	require.Equal(t, http.StatusNotFound, getWith(t, off.base+"/admin/parked", "adm-s3cret"))
	require.Equal(t, http.StatusOK, getWith(t, off.base+"/readyz", ""))
	off.stop(t)
	require.Contains(t, off.out.String(), "AUTH_TOKENS=(unset: admin API disabled)")

	_, err := loadConfig(envFrom(map[string]string{"ORDERS_API_TOKEN": "svc", "AUTH_TOKENS": "t=ops:root"}))
	require.ErrorContains(t, err, `AUTH_TOKENS: entry 1 (subject "ops"): unknown role "root"`)
}

func getWith(t *testing.T, url, token string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	return res.StatusCode
}
