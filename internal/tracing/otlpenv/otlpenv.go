// Package otlpenv builds the OpenTelemetry tracer provider that the standard OTEL_*
// environment variables ask for, exporting OTLP over HTTP or gRPC. Only the command
// line links it: a program that imports the client or the worker brings its own
// provider, and links no exporter.
package otlpenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Provider is a TracerProvider set up by FromEnv, with the Shutdown that flushes its
// spans. A nil *Provider is tracing off.
type Provider struct {
	sdk *sdktrace.TracerProvider
}

// Get is p's provider, or nil (off) for a nil p.
func (p *Provider) Get() trace.TracerProvider {
	if p == nil {
		return nil
	}
	return p.sdk
}

// Shutdown flushes and stops p; nothing for a nil p.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}

// Enabled reports whether the environment asks for traces: OTEL_TRACES_EXPORTER set
// (otlp; FromEnv refuses any other), or an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
// with OTEL_TRACES_EXPORTER unset; never with OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none. Tracing is off by default.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch exp := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))); exp {
	case "":
		return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	case "none":
		return false
	default: // otlp, or one FromEnv refuses by name
		return true
	}
}

// ErrExporter is returned (wrapped) for an OTEL_TRACES_EXPORTER or protocol jobbus
// does not export to.
var ErrExporter = errors.New("otlpenv: unsupported exporter")

// FromEnv builds the tracer provider that the standard OpenTelemetry environment asks
// for, or nil when it asks for none (Enabled). The OTLP exporters read their own
// variables (endpoint, headers, TLS, timeout, compression); the protocol is
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL: http/protobuf
// (the default) or grpc. The SDK reads the sampler (OTEL_TRACES_SAMPLER, default
// parentbased_always_on), the batch processor's OTEL_BSP_* and the resource's
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; service.name defaults to "jobbus"
// and jobbus.role names the process's part (coordinator, worker, client, ...).
func FromEnv(ctx context.Context, role string) (*Provider, error) {
	if !Enabled(os.Getenv) {
		return nil, nil
	}
	if exp := strings.ToLower(os.Getenv("OTEL_TRACES_EXPORTER")); exp != "" && exp != "otlp" {
		return nil, fmt.Errorf("%w: OTEL_TRACES_EXPORTER=%s (jobbus exports otlp or none)", ErrExporter, exp)
	}
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp sdktrace.SpanExporter
	var err error
	switch strings.ToLower(proto) {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("%w: OTLP protocol %q (http/protobuf or grpc)", ErrExporter, proto)
	}
	if err != nil {
		return nil, fmt.Errorf("otlpenv: otlp exporter: %w", err)
	}
	res, err := resource.Merge(resource.NewSchemaless(semconv.ServiceName("jobbus"), attribute.String(AttrRole, role)), resource.Environment())
	if err != nil {
		res = resource.NewSchemaless(semconv.ServiceName("jobbus"), attribute.String(AttrRole, role))
	}
	return &Provider{sdk: sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))}, nil
}

// AttrRole names the part of jobbus a process runs, on its resource.
const AttrRole = "jobbus.role"
