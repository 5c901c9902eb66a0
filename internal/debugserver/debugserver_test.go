package debugserver_test

import (
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/debugserver"
)

// TestStart: the listener serves the pprof index and a named profile, and
// is gone after Close; an empty address starts nothing.
func TestStart(t *testing.T) {
	t.Parallel()
	s, err := debugserver.Start("127.0.0.1:0", slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	base := "http://" + s.Addr()
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/cmdline"} {
		res, err := http.Get(base + path)
		require.NoError(t, err)
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode, path)
		require.NotEmpty(t, body, path)
	}
	require.NoError(t, s.Close())
	_, err = http.Get(base + "/debug/pprof/")
	require.Error(t, err, "closed with the service")

	none, err := debugserver.Start("", slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.Nil(t, none)
	require.NoError(t, none.Close(), "a nil server is a valid no-op")
	require.Empty(t, none.Addr())
}

// TestStartPortTaken: a taken port fails at once, so a service refuses to
// start rather than running without the listener it was asked for.
func TestStartPortTaken(t *testing.T) {
	t.Parallel()
	s, err := debugserver.Start("127.0.0.1:0", slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer s.Close()
	_, err = debugserver.Start(s.Addr(), slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "DEBUG_ADDR="+s.Addr())
}

// TestCheckAddr: DEBUG_ADDR never shares a public listener's port.
func TestCheckAddr(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, debug string
		public      []string
		wantErr     string
	}{
		{"Off", "", []string{":8080"}, ""},
		{"Loopback", "127.0.0.1:6060", []string{":8080", ":9091"}, ""},
		{"AnyFreePort", "127.0.0.1:0", []string{":0"}, ""},
		{"OtherHostSamePort", "127.0.0.1:8080", []string{"10.0.0.1:8080"}, ""},
		{"SamePort", "127.0.0.1:8080", []string{":8080"}, "uses the port of the public listener"},
		{"WildcardDebug", ":9091", []string{":8080", "127.0.0.1:9091"}, "uses the port of the public listener"},
		{"Identical", "127.0.0.1:8081", []string{"127.0.0.1:8081"}, "uses the port of the public listener"},
		{"NoPort", "localhost", nil, "want host:port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := debugserver.CheckAddr(tc.debug, tc.public...)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}
