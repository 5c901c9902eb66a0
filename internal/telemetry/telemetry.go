// Package telemetry sets up OpenTelemetry tracing for the two services and
// puts trace ids into their logs (L4).
//
// Tracing is off by default. Without OTEL_TRACES_EXPORTER (or with it set
// to none, or OTEL_SDK_DISABLED=true) no SDK is installed: the global
// tracer provider stays OpenTelemetry's default, whose spans record
// nothing and only carry their parent's context along. A request that
// arrives with a traceparent still hands it to the outbox, the record and
// the email, as before tracing existed, at the cost of a few allocations.
// With an exporter configured, the SDK records spans and exports them in
// batches; Shutdown flushes what is left.
//
// The services configure it from the standard variables: the ones that
// decide whether tracing is on are read through the service's getenv, and
// the exporter's own settings (OTEL_EXPORTER_OTLP_ENDPOINT, _HEADERS,
// _PROTOCOL, OTEL_TRACES_SAMPLER, OTEL_BSP_*, OTEL_RESOURCE_ATTRIBUTES) by
// the OpenTelemetry SDK from the process environment, as every
// OpenTelemetry SDK does.
package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// The variables read through getenv.
const (
	EnvExporter    = "OTEL_TRACES_EXPORTER" // otlp, console or none (the default here)
	EnvSDKDisabled = "OTEL_SDK_DISABLED"    // true turns tracing off whatever else is set
	EnvServiceName = "OTEL_SERVICE_NAME"    // overrides the service's own name
)

// Propagator is how both services read and write trace context on HTTP:
// W3C Trace Context and W3C Baggage. The outbox and the Kafka records use
// W3C Trace Context alone, by contract (see package outbox).
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Tracing is the tracing a service runs with: off, or an SDK tracer
// provider with one exporter.
type Tracing struct {
	exporter string
	service  string
	off      string                   // why tracing is off, for the start-up log
	provider *sdktrace.TracerProvider // nil when off
}

// New reads the tracing settings and, when tracing is on, builds the SDK
// tracer provider and its exporter for service (the default service.name).
// It changes nothing global; Install does. It refuses an exporter or an
// OTLP protocol it does not know, so a typo stops the service at start-up
// instead of silently dropping every span.
func New(ctx context.Context, getenv func(string) string, service string) (*Tracing, error) {
	t := &Tracing{service: service, off: EnvExporter + " unset or none"}
	if name := strings.TrimSpace(getenv(EnvServiceName)); name != "" {
		t.service = name
	}
	disabled := false
	if v := strings.TrimSpace(getenv(EnvSDKDisabled)); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: want true or false", EnvSDKDisabled, v)
		}
		disabled = b
	}
	switch exp := strings.ToLower(strings.TrimSpace(getenv(EnvExporter))); exp {
	case "", "none":
		return t, nil
	case "otlp", "console":
		if disabled {
			t.off = EnvSDKDisabled + "=true"
			return t, nil
		}
		t.exporter = exp
	default:
		return nil, fmt.Errorf("%s=%q: want otlp, console or none (tracing is off when unset)", EnvExporter, exp)
	}

	exporter, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("trace exporter %s: %w", t.exporter, err)
	}
	// Later detectors win: the service's name over the SDK's default, and
	// the service name read through getenv over OTEL_RESOURCE_ATTRIBUTES.
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
		resource.WithAttributes(attribute.String("service.name", t.service)),
	)
	if err != nil {
		_ = exporter.Shutdown(ctx)
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	// The sampler (OTEL_TRACES_SAMPLER, default parent-based always-on) and
	// the batching (OTEL_BSP_*) come from the environment.
	t.provider = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	return t, nil
}

// Enabled reports whether spans are recorded and exported.
func (t *Tracing) Enabled() bool { return t.provider != nil }

// TracerProvider returns the SDK provider when tracing is on, and the
// global provider otherwise.
func (t *Tracing) TracerProvider() trace.TracerProvider {
	if t.provider == nil {
		return otel.GetTracerProvider()
	}
	return t.provider
}

// String describes the tracing for the start-up log.
func (t *Tracing) String() string {
	if t.provider == nil {
		return "off (" + t.off + ")"
	}
	return "exporting to " + t.exporter + " as " + t.service
}

// Install makes t the process's tracing: the propagator (always, so a
// caller's trace context is passed on even when tracing is off), the SDK
// provider when tracing is on, and the SDK's internal errors (a collector
// that cannot be reached) logged to log rather than to stderr.
func (t *Tracing) Install(log *slog.Logger) {
	otel.SetTextMapPropagator(Propagator())
	if t.provider == nil {
		return
	}
	otel.SetTracerProvider(t.provider)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("opentelemetry", "error", err.Error())
	}))
}

// Shutdown exports the spans still buffered and stops the exporter. ctx
// bounds the wait: a collector that does not answer cannot hold up the
// service's stop.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t.provider == nil {
		return nil
	}
	if err := t.provider.Shutdown(ctx); err != nil {
		return fmt.Errorf("flush traces: %w", err)
	}
	return nil
}

// Setup is New followed by Install, for a service's run function. The
// caller defers Shutdown.
func Setup(ctx context.Context, getenv func(string) string, service string, log *slog.Logger) (*Tracing, error) {
	t, err := New(ctx, getenv, service)
	if err != nil {
		return nil, fmt.Errorf("invalid tracing configuration: %w", err)
	}
	t.Install(log)
	log.InfoContext(ctx, "tracing "+t.String())
	return t, nil
}
