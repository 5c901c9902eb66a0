package telemetry_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/outboxref/orders/internal/telemetry"
)

var testTime = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func env(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }

// TestTracingOffByDefault (L4): with OTEL_TRACES_EXPORTER unset or none, or
// the SDK disabled, no SDK provider is built: nothing is recorded or
// exported, and Shutdown has nothing to flush.
func TestTracingOffByDefault(t *testing.T) {
	t.Parallel()
	for name, vars := range map[string]map[string]string{
		"Unset":       {},
		"None":        {telemetry.EnvExporter: "none"},
		"NoneUpper":   {telemetry.EnvExporter: " NONE "},
		"SDKDisabled": {telemetry.EnvExporter: "otlp", telemetry.EnvSDKDisabled: "true"},
		"OnlyName":    {telemetry.EnvServiceName: "shop"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tr, err := telemetry.New(t.Context(), env(vars), "orders")
			require.NoError(t, err)
			require.False(t, tr.Enabled())
			_, isSDK := tr.TracerProvider().(*sdktrace.TracerProvider)
			require.False(t, isSDK, "no SDK provider when tracing is off")
			require.Contains(t, tr.String(), "off")
			require.NoError(t, tr.Shutdown(t.Context()))
		})
	}
}

// TestTracingRefusesUnknownSettings: a typo stops the service at start-up
// rather than dropping every span silently.
func TestTracingRefusesUnknownSettings(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		vars map[string]string
		want string
	}{
		"Exporter":    {map[string]string{telemetry.EnvExporter: "jaeger"}, `OTEL_TRACES_EXPORTER="jaeger"`},
		"SDKDisabled": {map[string]string{telemetry.EnvSDKDisabled: "maybe"}, `OTEL_SDK_DISABLED="maybe"`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := telemetry.New(t.Context(), env(tc.vars), "orders")
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestInstallWhenOff: with tracing off, Install sets only the propagator
// (W3C tracecontext and baggage), and the global provider's spans record
// nothing but carry their parent's context, so a caller's traceparent still
// travels on. It changes global state, so it does not run in parallel; it
// restores the propagator it replaced.
func TestInstallWhenOff(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
	tr, err := telemetry.New(t.Context(), env(nil), "orders")
	require.NoError(t, err)
	tr.Install(slog.New(slog.DiscardHandler))

	require.ElementsMatch(t, []string{"traceparent", "tracestate", "baggage"}, otel.GetTextMapPropagator().Fields())
	ctx, parent := remoteSpan(t)
	_, span := otel.GetTracerProvider().Tracer("test").Start(ctx, "child")
	require.False(t, span.IsRecording())
	require.Equal(t, parent, span.SpanContext(), "the parent's context passes through")
}

// TestTracingExportsOnShutdown (L4): with OTEL_TRACES_EXPORTER=otlp the SDK
// records spans with the service's name (OTEL_SERVICE_NAME overrides it)
// and Shutdown flushes them to the OTLP/HTTP endpoint. The exporter reads
// its endpoint from the process environment, so this test sets it there
// and cannot run in parallel.
func TestTracingExportsOnShutdown(t *testing.T) {
	var mu sync.Mutex
	var posts []string
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		posts = append(posts, r.URL.Path+" "+r.Header.Get("Content-Type"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(collector.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv(telemetry.EnvExporter, "otlp")

	for name, tc := range map[string]struct{ serviceName, want string }{
		"DefaultName":  {"", "orders"},
		"OverriddenBy": {"shop-orders", "shop-orders"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(telemetry.EnvServiceName, tc.serviceName)
			mu.Lock()
			posts = nil
			mu.Unlock()
			tr, err := telemetry.New(t.Context(), os.Getenv, "orders")
			require.NoError(t, err)
			require.True(t, tr.Enabled())
			require.Contains(t, tr.String(), "as "+tc.want)

			_, span := tr.TracerProvider().Tracer("test").Start(t.Context(), "work")
			require.True(t, span.IsRecording())
			ro, ok := span.(sdktrace.ReadOnlySpan)
			require.True(t, ok)
			name, found := ro.Resource().Set().Value("service.name")
			require.True(t, found)
			require.Equal(t, tc.want, name.AsString())
			span.End()

			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			require.NoError(t, tr.Shutdown(ctx))
			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, []string{"/v1/traces application/x-protobuf"}, posts, "the batch is flushed on shutdown")
		})
	}
}

// TestTracingRefusesUnknownProtocol: OTLP over a protocol the SDK does not
// speak is refused at start-up. It sets the process environment, which the
// exporter reads, so it does not run in parallel.
func TestTracingRefusesUnknownProtocol(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
	t.Setenv(telemetry.EnvExporter, "otlp")
	_, err := telemetry.New(t.Context(), os.Getenv, "orders")
	require.ErrorContains(t, err, "trace exporter otlp")
}
