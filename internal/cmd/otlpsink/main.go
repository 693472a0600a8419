// Command otlpsink is a minimal OTLP/HTTP trace receiver for measurements: it accepts
// POST /v1/traces (protobuf, optionally gzip), decodes each request as a collector
// would, counts the spans, and prints the count every second and when stopped.
// It stores nothing. For `jobbus bench` with tracing on:
//
//	go run ./internal/cmd/otlpsink -listen 127.0.0.1:4318 &
//	OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 jobbus bench
package main

import (
	"compress/gzip"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:4318", "address to listen on")
	flag.Parse()
	var spans, requests atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		body := io.Reader(r.Body)
		if r.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = gz
		}
		data, err := io.ReadAll(body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(data, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				spans.Add(int64(len(ss.GetSpans())))
			}
		}
		requests.Add(1)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	})
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		var last int64
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if n := spans.Load(); n != last {
					fmt.Fprintf(os.Stderr, "otlpsink: %d spans in %d requests\n", n, requests.Load())
					last = n
				}
			}
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	fmt.Fprintf(os.Stderr, "otlpsink: listening on %s\n", *listen)
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, "otlpsink:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "otlpsink: %d spans in %d requests\n", spans.Load(), requests.Load())
}
