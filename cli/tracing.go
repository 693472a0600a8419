package cli

import (
	"context"
	"log/slog"
	"time"

	"github.com/urfave/cli/v2"
	"go.opentelemetry.io/otel/trace"

	"github.com/jobbus/jobbus/internal/tracing/otlpenv"
)

// tracerFromEnv is the tracer provider the standard OTEL_* variables ask for (nil:
// tracing off, the default), and the function that flushes its spans when the
// command ends. role names the process's part on its resource (jobbus.role).
func tracerFromEnv(c *cli.Context, role string, log *slog.Logger) (trace.TracerProvider, func(), error) {
	p, err := otlpenv.FromEnv(c.Context, role)
	if err != nil {
		return nil, func() {}, usageError("%v", err)
	}
	if p == nil {
		return nil, func() {}, nil
	}
	if log != nil {
		log.Info("tracing on: exporting spans over OTLP (OTEL_* environment)")
	}
	return p.Get(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil && log != nil {
			log.Warn("tracing: spans not all exported", "err", err)
		}
	}, nil
}
