package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker"
	"github.com/jobbus/jobbus/worker/tasks"
)

// seen is what a handler's context carried, per attempt.
type seen struct {
	mu  sync.Mutex
	ctx map[int]trace.SpanContext
}

func (s *seen) put(attempt int, sc trace.SpanContext) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ctx[attempt] = sc
}

func (s *seen) get(attempt int) trace.SpanContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctx[attempt]
}

// flakySetup starts a system whose coordinator and worker trace into tp (nil: off),
// with a worker serving FLAKY: it fails its first attempt and succeeds the next,
// noting the span context its handler's context carries.
func flakySetup(t *testing.T, tp trace.TracerProvider) (*jobbustest.System, *seen, string) {
	t.Helper()
	sys := jobbustest.Start(t, jobbustest.WithCoordinatorConfig(func(c *coordinator.Config) { c.TracerProvider = tp }))
	got := &seen{ctx: map[int]trace.SpanContext{}}
	w, _ := sys.StartFunctionWorker(t, func(w *worker.Worker) error {
		return w.Handle("FLAKY", func(ctx context.Context, attempt int, _ json.RawMessage) (string, error) {
			got.put(attempt, trace.SpanContextFromContext(ctx))
			worker.Progress(ctx, 0.5, "half way")
			worker.Logger(ctx).Info("trying", "attempt", attempt)
			if attempt == 1 {
				return "", errors.New("first attempt fails")
			}
			return "ok", nil
		})
	}, worker.WithTracerProvider(tp))
	cl := client.New(sys.NC)
	testkit.Eventually(t, 15*time.Second, "worker listed", func() bool { return jobbustest.WorkerListed(cl, w.ID()) })
	return sys, got, w.ID()
}

// TestTraceFromClientToWorkerAndBack: one trace holds the client's submit span and,
// as its children, the coordinator's admission (with the job's id), queued (queue and
// priority) and result (state) spans and the worker's attempt spans: a retried job's
// two attempts are siblings, each with its number, worker and outcome, and each
// handler's context carries its attempt's span.
func TestTraceFromClientToWorkerAndBack(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	sys, got, workerID := flakySetup(t, tp)
	cl := client.New(sys.NC, client.WithTracerProvider(tp))

	ctx, root := tp.Tracer("test").Start(context.Background(), "test request")
	id, err := cl.Submit(ctx, "FLAKY", map[string]any{}, client.MaxAttempts(2))
	if err != nil {
		t.Fatal(err)
	}
	root.End()
	if job, err := cl.Wait(context.Background(), id); err != nil || job.State != protocol.StateCompleted || job.Attempts != 2 {
		t.Fatalf("job %s: %+v, %v; want COMPLETED after 2 attempts", id, job, err)
	}
	// The last result span ends once its write is durable, after the job's state is.
	var spans tracetest.SpanStubs
	testkit.Eventually(t, 10*time.Second, "spans exported", func() bool {
		spans = exp.GetSpans()
		return len(named(spans, "jobbus result")) == 2 && len(named(spans, "jobbus admit")) == 1
	})

	submit := one(t, spans, "jobbus submit")
	if submit.Parent.SpanID() != root.SpanContext().SpanID() || submit.SpanKind != trace.SpanKindProducer {
		t.Fatalf("submit span: parent %s kind %s, want the test's span and producer", submit.Parent.SpanID(), submit.SpanKind)
	}
	if attr(submit, "messaging.destination.name") != "FLAKY" || attr(submit, "messaging.system") != "jobbus" {
		t.Fatalf("submit span attributes %v", submit.Attributes)
	}
	for _, s := range spans {
		if s.SpanContext.TraceID() != root.SpanContext().TraceID() {
			t.Fatalf("span %q is in trace %s, want the test's %s", s.Name, s.SpanContext.TraceID(), root.SpanContext().TraceID())
		}
	}
	childOfSubmit := func(name string, n int) tracetest.SpanStubs {
		t.Helper()
		ss := named(spans, name)
		if len(ss) != n {
			t.Fatalf("%d %q spans, want %d", len(ss), name, n)
		}
		for _, s := range ss {
			if s.Parent.SpanID() != submit.SpanContext.SpanID() {
				t.Fatalf("%q span's parent is %s, want the submit span %s", name, s.Parent.SpanID(), submit.SpanContext.SpanID())
			}
		}
		return ss
	}
	if admit := childOfSubmit("jobbus admit", 1)[0]; attr(admit, "messaging.message.id") != id || admit.SpanKind != trace.SpanKindServer {
		t.Fatalf("admit span: %v kind %s, want the job's id %s and server", admit.Attributes, admit.SpanKind, id)
	}
	for i, q := range inOrder(childOfSubmit("jobbus queued", 2)) {
		if attr(q, "jobbus.queue") != "default" || attr(q, "jobbus.priority") != "NORMAL" {
			t.Fatalf("queued span of attempt %d: %v", i+1, q.Attributes)
		}
	}
	attempts := byAttempt(childOfSubmit("jobbus attempt", 2)) // siblings, under the submit span
	for i, want := range []string{"failure", "success"} {
		a := attempts[i]
		if attr(a, "jobbus.outcome") != want || attr(a, "jobbus.worker.id") != workerID || a.SpanKind != trace.SpanKindConsumer ||
			attr(a, "messaging.system") != "jobbus" {
			t.Fatalf("attempt %d span: %v kind %s; want outcome %s on %s", i+1, a.Attributes, a.SpanKind, want, workerID)
		}
		if sc := got.get(i + 1); sc.SpanID() != a.SpanContext.SpanID() {
			t.Fatalf("attempt %d's handler context carried span %s, want its attempt span %s", i+1, sc.SpanID(), a.SpanContext.SpanID())
		}
	}
	results := inOrder(childOfSubmit("jobbus result", 2))
	for i, want := range []protocol.State{protocol.StateRetryWait, protocol.StateCompleted} {
		if attr(results[i], "jobbus.state") != string(want) {
			t.Fatalf("result span of attempt %d: %v, want state %s", i+1, results[i].Attributes, want)
		}
	}
}

// TestUnsampledJobGetsNoSpans: with tracing on, a job submitted in a trace that is
// not sampled gets no span from the coordinator or the worker (their spans follow the
// job's sampling decision), while its handler's context still carries that trace.
func TestUnsampledJobGetsNoSpans(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	sys, got, _ := flakySetup(t, tp)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	submitFlakyWith(t, sys.NC, "00-"+traceID+"-00f067aa0ba902b7-00")
	cl := client.New(sys.NC, client.WithTracerProvider(tp))
	if sc := got.get(2); sc.TraceID().String() != traceID || sc.IsSampled() {
		t.Fatalf("handler's context: trace %s sampled %v; want the unsampled %s", sc.TraceID(), sc.IsSampled(), traceID)
	}
	// A sampled job after it: once its spans are exported, the unsampled one's would be.
	id, err := cl.Submit(context.Background(), "FLAKY", map[string]any{}, client.MaxAttempts(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Wait(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the sampled job's spans", func() bool { return len(named(exp.GetSpans(), "jobbus result")) == 2 })
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID().String() == traceID {
			t.Fatalf("span %q recorded for the unsampled job's trace", s.Name)
		}
	}
}

// TestWorkflowStepsJoinTheSubmittersTrace: the steps of a workflow submitted in a
// traced context are jobs of that trace: each step's attempt spans (and the
// coordinator's queued and result spans) are children of the submitter's span.
func TestWorkflowStepsJoinTheSubmittersTrace(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	sys, _, _ := flakySetup(t, tp)
	cl := client.New(sys.NC)
	ctx, root := tp.Tracer("test").Start(context.Background(), "test request")
	wf := client.NewWorkflow("traced").Step("a", "FLAKY", map[string]any{}).Step("b", "FLAKY", map[string]any{}).Chain("a", "b")
	sub, err := cl.SubmitWorkflow(ctx, wf)
	if err != nil {
		t.Fatal(err)
	}
	root.End()
	for name, id := range sub.Jobs {
		if job, err := cl.Wait(context.Background(), id); err != nil || job.State != protocol.StateCompleted {
			t.Fatalf("step %s (%s): %+v, %v; want COMPLETED", name, id, job, err)
		}
	}
	var spans tracetest.SpanStubs
	testkit.Eventually(t, 10*time.Second, "spans exported", func() bool {
		spans = exp.GetSpans()
		return len(named(spans, "jobbus result")) == 4 // two attempts of each step
	})
	for _, name := range []string{"jobbus attempt", "jobbus queued", "jobbus result"} {
		ss := named(spans, name)
		if len(ss) != 4 {
			t.Fatalf("%d %q spans, want 4 (two attempts of each of the 2 steps)", len(ss), name)
		}
		for _, s := range ss {
			if s.Parent.SpanID() != root.SpanContext().SpanID() || s.SpanContext.TraceID() != root.SpanContext().TraceID() {
				t.Fatalf("%q span in trace %s under %s, want under the submitter's span %s", name, s.SpanContext.TraceID(), s.Parent.SpanID(), root.SpanContext().SpanID())
			}
		}
	}
}

// TestTraceparentHeaderReachesTheHandler: a submission over the plain NATS API with a
// traceparent header makes a job whose handler's context carries that trace, with
// tracing off everywhere.
func TestTraceparentHeaderReachesTheHandler(t *testing.T) {
	t.Parallel()
	sys, got, _ := flakySetup(t, nil)
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	submitFlakyWith(t, sys.NC, "00-"+traceID+"-"+parentID+"-01")
	for attempt := 1; attempt <= 2; attempt++ {
		sc := got.get(attempt)
		if sc.TraceID().String() != traceID || sc.SpanID().String() != parentID || !sc.IsRemote() {
			t.Fatalf("attempt %d's handler context: trace %s span %s remote %v; want the header's %s/%s",
				attempt, sc.TraceID(), sc.SpanID(), sc.IsRemote(), traceID, parentID)
		}
	}
}

// submitFlakyWith submits a FLAKY job over the plain NATS API with a traceparent
// header and waits until it completed.
func submitFlakyWith(t *testing.T, nc *nats.Conn, traceparent string) {
	t.Helper()
	msg := nats.NewMsg(protocol.APIPrefix + ".submit")
	msg.Header.Set("traceparent", traceparent)
	msg.Data = []byte(`{"type":"SUBMIT_JOB","taskType":"FLAKY","payload":{},"maxAttempts":2}`)
	reply, err := nc.RequestMsg(msg, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	m, err := protocol.Decode(reply.Data)
	if err != nil {
		t.Fatal(err)
	}
	sub, ok := m.(*protocol.JobSubmitted)
	if !ok {
		t.Fatalf("reply %s", reply.Data)
	}
	if job, err := client.New(nc).Wait(context.Background(), sub.JobID); err != nil || job.State != protocol.StateCompleted {
		t.Fatalf("job: %+v, %v", job, err)
	}
}

func named(spans tracetest.SpanStubs, name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func one(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	ss := named(spans, name)
	if len(ss) != 1 {
		t.Fatalf("%d %q spans, want 1", len(ss), name)
	}
	return ss[0]
}

func attr(s tracetest.SpanStub, key string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// inOrder orders spans by their start: a job's queued and result spans, one per
// attempt, do not overlap.
func inOrder(spans tracetest.SpanStubs) tracetest.SpanStubs {
	out := slices.Clone(spans)
	slices.SortFunc(out, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	return out
}

// byAttempt orders spans by their jobbus.attempt, from 1.
func byAttempt(spans tracetest.SpanStubs) tracetest.SpanStubs {
	out := make(tracetest.SpanStubs, len(spans))
	for _, s := range spans {
		var n int
		_, _ = fmt.Sscan(attr(s, "jobbus.attempt"), &n)
		if n >= 1 && n <= len(out) {
			out[n-1] = s
		}
	}
	return out
}

// scopedErr is a handler's error that reads state its attempt holds, as one whose
// text comes from a buffer the handler releases once the attempt's context ends:
// read after that, it panics.
type scopedErr struct{ ctx context.Context }

func (e scopedErr) Error() string {
	if e.ctx.Err() != nil {
		panic("error read after its attempt ended")
	}
	return "scoped failure"
}

func (e scopedErr) Is(target error) bool {
	if e.ctx.Err() != nil {
		panic("error read after its attempt ended")
	}
	return target == tasks.ErrPermanent
}

// TestAttemptErrorReadOnce: an attempt whose handler's error panics when read after
// the attempt ended fails with what the error said while the attempt ran, and the
// worker runs on; traced, its span ends with that too (outcome permanent_failure,
// status and exception event with its text). Before, the worker read the error again
// once the attempt ended, outside any recover (the span as it ended, and whether the
// attempt was stopped by a shutdown as its result went), and the panic ended the
// worker process.
func TestAttemptErrorReadOnce(t *testing.T) {
	t.Parallel()
	for _, traced := range []bool{false, true} {
		t.Run(fmt.Sprintf("traced=%v", traced), func(t *testing.T) {
			t.Parallel()
			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			var opts []worker.Option
			if traced {
				opts = append(opts, worker.WithTracerProvider(tp))
			}
			sys := jobbustest.Start(t)
			w, _ := sys.StartFunctionWorker(t, func(w *worker.Worker) error {
				if err := w.Handle("OK", func(context.Context, int, json.RawMessage) (string, error) { return "ok", nil }); err != nil {
					return err
				}
				return w.Handle("SCOPED", func(ctx context.Context, _ int, _ json.RawMessage) (string, error) {
					return "", scopedErr{ctx}
				})
			}, opts...)
			cl := client.New(sys.NC, client.WithTracerProvider(tp))
			testkit.Eventually(t, 15*time.Second, "worker listed", func() bool { return jobbustest.WorkerListed(cl, w.ID()) })

			id, err := cl.Submit(context.Background(), "SCOPED", map[string]any{}, client.MaxAttempts(3))
			if err != nil {
				t.Fatal(err)
			}
			job, err := cl.Wait(context.Background(), id)
			if err != nil || job.State != protocol.StateFailed || job.Attempts != 1 || !strings.HasPrefix(deref(job.Error), "scoped failure") {
				t.Fatalf("job %s: %+v (error %q), %v; want FAILED (permanent) after 1 attempt with \"scoped failure\"", id, job, deref(job.Error), err)
			}
			next, err := cl.Submit(context.Background(), "OK", map[string]any{})
			if err != nil {
				t.Fatal(err)
			}
			if job, err := cl.Wait(context.Background(), next); err != nil || job.State != protocol.StateCompleted {
				t.Fatalf("the next job %s: %+v, %v; want COMPLETED by the same worker", next, job, err)
			}
			if !traced {
				return
			}
			var spans tracetest.SpanStubs
			testkit.Eventually(t, 10*time.Second, "attempt spans exported", func() bool {
				spans = named(exp.GetSpans(), "jobbus attempt")
				return len(spans) == 2
			})
			var a tracetest.SpanStub
			for _, s := range spans {
				if attr(s, "jobbus.outcome") != "success" {
					a = s
				}
			}
			if attr(a, "jobbus.outcome") != "permanent_failure" || a.Status.Code != codes.Error || a.Status.Description != "scoped failure" {
				t.Fatalf("failed attempt's span: %v status %+v; want outcome permanent_failure, error \"scoped failure\"", a.Attributes, a.Status)
			}
			if len(a.Events) != 1 || a.Events[0].Name != "exception" || eventAttr(a.Events[0].Attributes, "exception.message") != "scoped failure" ||
				!strings.HasSuffix(eventAttr(a.Events[0].Attributes, "exception.type"), "worker_test.scopedErr") {
				t.Fatalf("failed attempt's span events %+v; want one exception \"scoped failure\" of type scopedErr", a.Events)
			}
		})
	}
}

func eventAttr(attrs []attribute.KeyValue, key string) string {
	for _, a := range attrs {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}
