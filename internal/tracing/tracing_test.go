package tracing_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/jobbus/jobbus/internal/tracing"
)

func TestParseFormat(t *testing.T) {
	t.Parallel()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tests := []struct {
		name, traceparent, tracestate string
		valid                         bool
		wantState                     string
	}{
		{"Valid", tp, "", true, ""},
		{"WithState", tp, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7", true, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"},
		{"Empty", "", "k=v", false, ""},
		{"Garbage", "not a traceparent", "", false, ""},
		{"ZeroTraceID", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "", false, ""},
		{"BadVersion", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "", false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sc := tracing.Parse(tt.traceparent, tt.tracestate)
			if sc.IsValid() != tt.valid || tracing.Valid(tt.traceparent) != tt.valid {
				t.Fatalf("Parse(%q) valid %v, want %v", tt.traceparent, sc.IsValid(), tt.valid)
			}
			gotTP, gotTS := tracing.Format(sc)
			if tt.valid && (gotTP != tt.traceparent || gotTS != tt.wantState) {
				t.Fatalf("Format = %q %q, want %q %q", gotTP, gotTS, tt.traceparent, tt.wantState)
			}
			if gotTP, gotTS := tracing.Normal(sc, tt.traceparent, tt.tracestate); tt.valid && (gotTP != tt.traceparent || gotTS != tt.wantState) {
				t.Fatalf("Normal = %q %q, want %q %q", gotTP, gotTS, tt.traceparent, tt.wantState)
			}
			ctx := tracing.ContextWith(context.Background(), tt.traceparent, tt.tracestate)
			if got := trace.SpanContextFromContext(ctx); got.IsValid() != tt.valid || (tt.valid && !got.IsRemote()) {
				t.Fatalf("ContextWith: %v remote %v", got.IsValid(), got.IsRemote())
			}
		})
	}
}

func TestTracerOffUnlessGivenAProvider(t *testing.T) {
	t.Parallel()
	for name, tp := range map[string]trace.TracerProvider{"Nil": nil, "Noop": noop.NewTracerProvider()} {
		if tracing.New(tp).On() {
			t.Errorf("%s provider: tracer on", name)
		}
	}
	var off tracing.Tracer
	ctx, span := off.Start(context.Background(), "x")
	if span.IsRecording() || ctx != context.Background() {
		t.Error("the zero tracer started a recording span")
	}
	sdk := sdktrace.NewTracerProvider()
	defer func() { _ = sdk.Shutdown(context.Background()) }()
	if !tracing.New(sdk).On() {
		t.Error("an SDK provider: tracer off")
	}
}

// TestNormalFormatsWhatIsNotVersion00: a traceparent of a later version (with fields
// after the flags) is stored as version 00, which every worker parses.
func TestNormalFormatsWhatIsNotVersion00(t *testing.T) {
	t.Parallel()
	const later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future"
	sc := tracing.Parse(later, "")
	if !sc.IsValid() {
		t.Fatal("a later version's traceparent did not parse")
	}
	if tp, _ := tracing.Normal(sc, later, ""); tp != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Fatalf("Normal = %q, want it as version 00", tp)
	}
}

// TestSamplesFollowsTheJobsTrace: with tracing on, spans are started for a job whose
// trace is sampled or absent (a root, which the sampler decides), never for one whose
// trace is not sampled; with tracing off, never.
func TestSamplesFollowsTheJobsTrace(t *testing.T) {
	t.Parallel()
	sdk := sdktrace.NewTracerProvider()
	defer func() { _ = sdk.Shutdown(context.Background()) }()
	on := tracing.New(sdk)
	var off tracing.Tracer
	tests := []struct {
		name        string
		traceparent string
		want        bool
	}{
		{"Sampled", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
		{"NotSampled", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", false},
		{"NoTrace", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sc := tracing.Parse(tt.traceparent, "")
			if got := on.Samples(sc); got != tt.want {
				t.Errorf("on: Samples = %v, want %v", got, tt.want)
			}
			if off.Samples(sc) {
				t.Error("off: Samples = true")
			}
		})
	}
}
