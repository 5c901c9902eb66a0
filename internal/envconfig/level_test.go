package envconfig_test

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/envconfig"
)

// TestLogLevel: the four levels in any case, the default when unset, and a
// clear refusal of anything else.
func TestLogLevel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want slog.Level
	}{{"", slog.LevelInfo}, {"debug", slog.LevelDebug}, {"INFO", slog.LevelInfo}, {"Warn", slog.LevelWarn}, {"error", slog.LevelError}} {
		r := envconfig.New(func(string) string { return tc.in })
		require.Equal(t, tc.want, r.LogLevel("LOG_LEVEL", slog.LevelInfo), "LOG_LEVEL=%q", tc.in)
		require.NoError(t, r.Err())
	}
	r := envconfig.New(func(string) string { return "verbose" })
	require.Equal(t, slog.LevelInfo, r.LogLevel("LOG_LEVEL", slog.LevelInfo))
	require.EqualError(t, r.Err(), `LOG_LEVEL="verbose": want debug, info, warn or error`)
	require.Equal(t, "warn", envconfig.LevelName(slog.LevelWarn))
}
