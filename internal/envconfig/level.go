package envconfig

import (
	"log/slog"
	"strings"
)

// LogLevel returns a log level variable: debug, info, warn or error, in
// any case. Anything else is refused rather than guessed at, so a typo
// does not silently leave a service at a level nobody chose.
func (r *Reader) LogLevel(name string, def slog.Level) slog.Level {
	v := r.String(name, "")
	switch strings.ToLower(v) {
	case "":
		return def
	case "debug":
		return slog.LevelDebug
	case "info":
		return slog.LevelInfo
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	r.Fail("%s=%q: want debug, info, warn or error", name, v)
	return def
}

// LevelName is how a level is written in LOG_LEVEL: lower case, the way a
// configuration print-out shows it.
func LevelName(l slog.Level) string { return strings.ToLower(l.String()) }
