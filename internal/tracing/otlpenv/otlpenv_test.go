package otlpenv

import (
	"errors"
	"testing"
)

func TestEnabled(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		want bool
	}{
		{"OffByDefault", nil, false},
		{"Exporter", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{"Endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{"TracesEndpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{"ExporterNone", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{"SDKDisabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false},
		{"OtherExporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, true}, // refused by FromEnv
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Enabled(func(k string) string { return tt.env[k] }); got != tt.want {
				t.Fatalf("Enabled = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestFromEnvRefusesWhatItCannotExport(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "zipkin")
	if _, err := FromEnv(t.Context(), "test"); !errors.Is(err, ErrExporter) {
		t.Fatalf("zipkin: %v, want ErrExporter", err)
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	if _, err := FromEnv(t.Context(), "test"); !errors.Is(err, ErrExporter) {
		t.Fatalf("http/json: %v, want ErrExporter", err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	p, err := FromEnv(t.Context(), "test")
	if err != nil || p == nil || p.Get() == nil {
		t.Fatalf("grpc: %v %v", p, err)
	}
	_ = p.Shutdown(t.Context())
}
