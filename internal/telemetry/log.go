package telemetry

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// LogHandler wraps h so that a record logged with a context holding a valid
// span context (the …Context calls: InfoContext, ErrorContext, Log) carries
// trace_id and span_id, the W3C hex forms a trace backend searches by. A log
// line can then be found from its trace, and the trace from its log line.
// Records logged without such a context are passed on unchanged.
//
// The two attributes are added last, so under a group opened with
// WithGroup they land inside that group; the services open none.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{inner: h} }

type logHandler struct{ inner slog.Handler }

// Enabled implements slog.Handler.
func (h logHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

// Handle implements slog.Handler.
func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		// A copy that shares nothing with the caller's record: another
		// handler may be given the same record.
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.inner.Handle(ctx, r)
}

// WithAttrs implements slog.Handler.
func (h logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logHandler{inner: h.inner.WithAttrs(attrs)}
}

// WithGroup implements slog.Handler.
func (h logHandler) WithGroup(name string) slog.Handler {
	return logHandler{inner: h.inner.WithGroup(name)}
}
