package cli_test

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/jobbus/jobbus/internal/testkit"
)

// otlpReceiver is a small OTLP trace receiver built on the OTLP protobufs, over HTTP
// (POST /v1/traces) or gRPC (TraceService/Export): what a collector or Jaeger gets.
type otlpReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []receivedSpan
}

type receivedSpan struct {
	name, traceID, role string
}

func (r *otlpReceiver) take(req *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		var role string
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "jobbus.role" {
				role = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, receivedSpan{name: s.GetName(), traceID: hex.EncodeToString(s.GetTraceId()), role: role})
			}
		}
	}
}

func (r *otlpReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.take(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.NotFound(w, req)
		return
	}
	body := io.Reader(req.Body)
	if req.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = gz
	}
	data, err := io.ReadAll(body)
	var msg coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(data, &msg)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.take(&msg)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// byTrace is the names of the spans received in the trace of a span named first, with
// the roles that sent them.
func (r *otlpReceiver) byTrace(first string) map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var trace string
	for _, s := range r.spans {
		if s.name == first {
			trace = s.traceID
		}
	}
	out := map[string]string{}
	for _, s := range r.spans {
		if trace != "" && s.traceID == trace {
			out[s.name] = s.role
		}
	}
	return out
}

// TestTracesReachAnOTLPReceiver: `jobbus serve` and `jobbus submit --wait` configured
// only by the standard OTEL_* variables export one trace of the job, from the client's
// submit span to the worker's attempt and the coordinator's result, to an OTLP
// receiver over HTTP and over gRPC.
func TestTracesReachAnOTLPReceiver(t *testing.T) {
	t.Parallel()
	for _, protocol := range []string{"http/protobuf", "grpc"} {
		t.Run(strings.ReplaceAll(protocol, "/", "-"), func(t *testing.T) {
			t.Parallel()
			rcv := &otlpReceiver{}
			var endpoint string
			if protocol == "grpc" {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				srv := grpc.NewServer()
				coltracepb.RegisterTraceServiceServer(srv, rcv)
				go func() { _ = srv.Serve(ln) }()
				t.Cleanup(srv.Stop)
				endpoint = "http://" + ln.Addr().String()
			} else {
				srv := httptest.NewServer(rcv)
				t.Cleanup(srv.Close)
				endpoint = srv.URL
			}
			env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL=" + protocol,
				"OTEL_EXPORTER_OTLP_INSECURE=true", "OTEL_BSP_SCHEDULE_DELAY=100"}
			serve := startProc(t, env, "serve", "--data-dir", t.TempDir(), "--nats-listen", "127.0.0.1:-1",
				"--worker-port", "-1", "--client-port", "-1", "--http-listen", "-", "--workers", "1")
			url := serve.logged(`msg="embedded NATS started" url=(\S+)`)[1]
			serve.logged(`msg="coordinator serving"`)
			serve.logged(`tracing on`)
			sub := startProc(t, env, "--nats", url, "submit", "sleep", "--milliseconds", "600", "--wait")
			if code := sub.wait(); code != 0 {
				t.Fatalf("submit --wait exited %d: %s", code, sub.stderr.String())
			}
			want := map[string]string{"jobbus submit": "client", "jobbus admit": "serve", "jobbus queued": "serve",
				"jobbus attempt": "serve", "jobbus result": "serve"}
			var got map[string]string
			testkit.Eventually(t, 20*time.Second, "the job's spans at the receiver", func() bool {
				got = rcv.byTrace("jobbus submit")
				for name, role := range want {
					if got[name] != role {
						return false
					}
				}
				return true
			})
		})
	}
}
