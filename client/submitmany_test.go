package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
)

var submitManySubject = func() string { e, _ := protocol.EndpointFor(protocol.TypeSubmitJobs); return e.Subject() }()

// overhear counts the requests on subject until the test ends, calling seen with each.
// A plain subscription is a responder: use it only where a coordinator serves subject
// too, or where nobody is to answer. Its handler may run after the request's reply
// arrived (over TCP the two even travel different connections): wait for its count.
func overhear(t *testing.T, nc *nats.Conn, subject string, seen func(*nats.Msg)) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		if seen != nil {
			seen(m)
		}
		n.Add(1) // after seen: a count waited for covers what seen recorded
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return &n
}

// batchRequestIDs decodes a SUBMIT_JOBS and returns its submissions' request ids.
func batchRequestIDs(t *testing.T, data []byte) []string {
	m, err := protocol.Decode(data)
	if err != nil {
		t.Errorf("batch does not decode: %v", err)
		return nil
	}
	var rids []string
	for _, s := range m.(*protocol.SubmitJobs).Jobs {
		rids = append(rids, s.RequestID)
	}
	return rids
}

// TestSubmitMany: one call submits several jobs in one request, over NATS and over
// the bridge's TCP client port; each result is its own submission's job, which runs.
func TestSubmitMany(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t)
	w, _ := sys.StartNativeWorker(t)
	br := sys.StartBridge(t)
	native := client.New(sys.NC)
	testkit.Eventually(t, 10*time.Second, "worker listed", func() bool { return jobbustest.WorkerListed(native, w.ID()) })

	var mu sync.Mutex
	var rids []string
	batches := overhear(t, sys.NC, submitManySubject, func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		rids = append(rids, batchRequestIDs(t, m.Data)...)
	})
	singles := overhear(t, sys.NC, submitSubject, nil)
	tcp, err := client.DialTCP(context.Background(), br.ClientAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()

	for _, tc := range []struct {
		name string
		c    *client.Client
	}{{"NATS", native}, {"TCP", tcp}} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		mu.Lock()
		rids = nil
		mu.Unlock()
		before := batches.Load()
		texts := []string{"a", "a b", "a b c", "a b c d", "a b c d e"}
		subs := make([]client.Submission, len(texts))
		for i, text := range texts {
			subs[i] = client.Submission{TaskType: "WORD_COUNT", Payload: map[string]string{"text": text}}
		}
		res, err := tc.c.SubmitMany(ctx, subs)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		testkit.Eventually(t, 5*time.Second, tc.name+": the batch overheard", func() bool { return batches.Load() > before })
		if n := batches.Load() - before; n != 1 || singles.Load() != 0 {
			t.Fatalf("%s: %d batches and %d singles, want 1 batch", tc.name, n, singles.Load())
		}
		mu.Lock()
		ids := rids
		mu.Unlock()
		for i, r := range res {
			if r.Err != nil {
				t.Fatalf("%s: submission %d: %v", tc.name, i, r.Err)
			}
			if want := protocol.RequestJobID(ids[i]); r.JobID != want {
				t.Fatalf("%s: submission %d is job %s, want %s (its request id's)", tc.name, i, r.JobID, want)
			}
			job, err := tc.c.Wait(ctx, r.JobID)
			if err != nil || job.State != protocol.StateCompleted || job.Result == nil || *job.Result != fmt.Sprint(i+1) {
				t.Fatalf("%s: job %d: %+v (%v), want COMPLETED with %d words", tc.name, i, job, err, i+1)
			}
		}
		cancel()
	}
}

// TestSubmitManyMixedOutcomes: each submission gets its own answer, as alone: an
// invalid one its ERROR, one past the active limit its rejection, the others jobs.
func TestSubmitManyMixedOutcomes(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t, jobbustest.WithCoordinatorConfig(func(c *coordinator.Config) { c.MaxActiveJobs = 2 }))
	c := client.New(sys.NC)
	ctx := context.Background()
	ok := client.Submission{TaskType: "SHA256", Payload: map[string]string{"text": "x"}}
	res, err := c.SubmitMany(ctx, []client.Submission{
		ok,
		{TaskType: "", Payload: map[string]string{"text": "x"}},
		ok,
		ok, // the third active job
		{TaskType: "SHA256", Payload: func() {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 2} {
		if res[i].Err != nil || res[i].JobID == "" {
			t.Fatalf("submission %d: %+v, want a job", i, res[i])
		}
		if _, err := c.Status(ctx, res[i].JobID); err != nil {
			t.Fatalf("status of submission %d's job: %v", i, err)
		}
	}
	var se *client.ServerError
	if !errors.As(res[1].Err, &se) || res[1].JobID != "" {
		t.Fatalf("submission 1 (no task type): %+v, want a ServerError", res[1])
	}
	var rejected *client.RejectedError
	if !errors.As(res[3].Err, &rejected) || !errors.Is(res[3].Err, client.ErrRejected) {
		t.Fatalf("submission 3 (past the limit): %+v, want a RejectedError", res[3])
	}
	if res[4].Err == nil || !strings.Contains(res[4].Err.Error(), "encode payload") {
		t.Fatalf("submission 4 (a func payload): %+v, want its encoding error", res[4])
	}
}

// TestSubmitManySplits: more than protocol.MaxSubmissions go in several requests,
// and every job is created.
func TestSubmitManySplits(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t)
	batches := overhear(t, sys.NC, submitManySubject, nil)
	c := client.New(sys.NC)
	ctx := context.Background()
	const n = 300
	subs := make([]client.Submission, n)
	for i := range subs {
		subs[i] = client.Submission{TaskType: "SHA256", Payload: map[string]string{"text": fmt.Sprint(i)}}
	}
	res, err := c.SubmitMany(ctx, subs)
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]bool, n)
	for i, r := range res {
		if r.Err != nil || seen[r.JobID] {
			t.Fatalf("submission %d: %+v, want a job of its own", i, r)
		}
		seen[r.JobID] = true
		if _, err := c.Status(ctx, r.JobID); err != nil {
			t.Fatalf("status of submission %d's job: %v", i, err)
		}
	}
	testkit.Eventually(t, 5*time.Second, "both requests overheard", func() bool { return batches.Load() >= 2 })
	if b := batches.Load(); b != 2 {
		t.Fatalf("%d requests for %d submissions, want 2", b, n)
	}
}

// TestSubmitManyWithoutBatches: where nobody serves submit.many (an older
// coordinator), each submission goes alone.
func TestSubmitManyWithoutBatches(t *testing.T) {
	t.Parallel()
	nc := jobbustest.Start(t, jobbustest.WithoutCoordinator()).NC
	serveSubmit(t, nc, func(m *nats.Msg) *nats.Msg {
		return submitted(protocol.RequestJobID(m.Header.Get(protocol.HeaderRequestID)))
	})
	c := client.New(nc)
	subs := make([]client.Submission, 3)
	for i := range subs {
		subs[i] = client.Submission{TaskType: "SHA256", Payload: i}
	}
	res, err := c.SubmitMany(context.Background(), subs)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, r := range res {
		if r.Err != nil || r.JobID == "" || seen[r.JobID] {
			t.Fatalf("submission %d: %+v, want a job of its own", i, r)
		}
		seen[r.JobID] = true
	}
}

// TestSubmitManyNoCoordinator: with nothing serving, the call fails with
// ErrNoCoordinator, and so does each submission.
func TestSubmitManyNoCoordinator(t *testing.T) {
	t.Parallel()
	nc := jobbustest.Start(t, jobbustest.WithoutCoordinator()).NC
	res, err := client.New(nc).SubmitMany(context.Background(), make([]client.Submission, 3))
	if !errors.Is(err, client.ErrNoCoordinator) {
		t.Fatalf("err = %v, want ErrNoCoordinator", err)
	}
	for i, r := range res {
		if !errors.Is(r.Err, client.ErrNoCoordinator) {
			t.Fatalf("submission %d: %+v, want ErrNoCoordinator", i, r)
		}
	}
}

// TestSubmitManyOutcomeUnknownNamesEachJob: a batch left unanswered (a frozen leader)
// ends each of its submissions with "Outcome unknown" naming its own job, and the call
// with ErrOutcomeUnknown; the submissions after it are not sent. Over TCP, the bridge
// says the batch's outcome is unknown, and the client names each job.
func TestSubmitManyOutcomeUnknownNamesEachJob(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		client func(t *testing.T, sys *jobbustest.System) *client.Client
	}{
		{"NATS", func(t *testing.T, sys *jobbustest.System) *client.Client {
			return client.New(sys.NC, client.WithTimeout(300*time.Millisecond))
		}},
		{"TCP", func(t *testing.T, sys *jobbustest.System) *client.Client {
			br := sys.StartBridge(t, func(c *bridge.Config) { c.RequestTimeout = 300 * time.Millisecond })
			return dial(t, br.ClientAddr().String(), client.WithTimeout(5*time.Second))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sys := jobbustest.Start(t, jobbustest.WithoutCoordinator())
			var mu sync.Mutex
			var first []string // the first batch's request ids
			batches := overhear(t, sys.NC, submitManySubject, func(m *nats.Msg) {
				rids := batchRequestIDs(t, m.Data)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case len(first) == 0:
					first = rids
				case strings.Join(rids, " ") != strings.Join(first, " "):
					t.Errorf("a second batch was sent after the first went unanswered")
				}
			})
			c := tc.client(t, sys)
			const n = protocol.MaxSubmissions + 2
			subs := make([]client.Submission, n)
			for i := range subs {
				subs[i] = client.Submission{TaskType: "SHA256", Payload: i}
			}
			res, err := c.SubmitMany(context.Background(), subs)
			if !errors.Is(err, client.ErrOutcomeUnknown) {
				t.Fatalf("err = %v, want ErrOutcomeUnknown", err)
			}
			if batches.Load() == 0 {
				t.Fatal("no batch sent")
			}
			mu.Lock()
			defer mu.Unlock()
			if len(first) != protocol.MaxSubmissions {
				t.Fatalf("first batch of %d, want %d", len(first), protocol.MaxSubmissions)
			}
			for i, r := range res {
				if i >= len(first) {
					if !errors.Is(r.Err, client.ErrNotSent) || errors.Is(r.Err, client.ErrOutcomeUnknown) {
						t.Fatalf("submission %d, after the batch: %v, want ErrNotSent", i, r.Err)
					}
					continue
				}
				job, ok := client.OutcomeJob(r.Err)
				if !errors.Is(r.Err, client.ErrOutcomeUnknown) || !ok {
					t.Fatalf("submission %d: %v, want Outcome unknown naming its job", i, r.Err)
				}
				if want := protocol.RequestJobID(first[i]); job != want {
					t.Fatalf("submission %d names job %s, want its own %s", i, job, want)
				}
			}
		})
	}
}

// TestSubmitManyRetriesRejected: with WithSubmitRetries, the submissions rejected as
// retryable are resubmitted, alone of the batch, under new request ids.
func TestSubmitManyRetriesRejected(t *testing.T) {
	t.Parallel()
	nc := jobbustest.Start(t, jobbustest.WithoutCoordinator()).NC
	var mu sync.Mutex
	var sizes []int
	rejected := map[string]bool{}
	sub, err := nc.Subscribe(submitManySubject, func(m *nats.Msg) {
		rids := batchRequestIDs(t, m.Data)
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, len(rids))
		var answers []json.RawMessage
		for i, rid := range rids {
			if rejected[rid] {
				t.Errorf("request id %s sent again after its rejection", rid)
			}
			var a protocol.Message = &protocol.JobSubmitted{JobID: protocol.RequestJobID(rid)}
			if len(sizes) == 1 && i%2 == 1 { // the first batch's odd ones
				rejected[rid] = true
				a = protocol.AtCapacity(10, 10)
			}
			answers = append(answers, mustEncode(a))
		}
		_ = m.Respond(mustEncode(&protocol.JobsSubmitted{Answers: answers}))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	for _, tc := range []struct {
		name    string
		retries int
		sizes   []int
	}{{"Retried", 2, []int{5, 2}}, {"OffByDefault", 0, []int{5}}} {
		mu.Lock()
		sizes = nil
		mu.Unlock()
		c := client.New(nc, client.WithSubmitRetries(tc.retries, time.Millisecond, 2*time.Millisecond))
		res, err := c.SubmitMany(context.Background(), make([]client.Submission, 5))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for i, r := range res {
			wantRejected := i%2 == 1 && tc.retries == 0
			if got := errors.Is(r.Err, client.ErrRejected); got != wantRejected || !got && (r.Err != nil || r.JobID == "") {
				t.Fatalf("%s: submission %d: %+v, rejected %v", tc.name, i, r, wantRejected)
			}
		}
		mu.Lock()
		if fmt.Sprint(sizes) != fmt.Sprint(tc.sizes) {
			t.Fatalf("%s: batches of %v, want %v", tc.name, sizes, tc.sizes)
		}
		mu.Unlock()
	}
}

// TestSubmitManyTraced: a traced call sends its trace context with the batch (the
// coordinator makes it every job's), in one span.
func TestSubmitManyTraced(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t)
	var traceparent atomic.Value
	heard := overhear(t, sys.NC, submitManySubject, func(m *nats.Msg) { traceparent.Store(m.Header.Get("traceparent")) })
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	c := client.New(sys.NC, client.WithTracerProvider(tp))
	res, err := c.SubmitMany(context.Background(), []client.Submission{{TaskType: "SHA256", Payload: map[string]string{"text": "x"}}, {TaskType: "SHA256", Payload: map[string]string{"text": "y"}}})
	if err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("%+v, %v", res, err)
	}
	testkit.Eventually(t, 5*time.Second, "the batch overheard", func() bool { return heard.Load() > 0 })
	ended := spans.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans ended, want 1", len(ended))
	}
	tp0, _ := traceparent.Load().(string)
	if want := ended[0].SpanContext().TraceID().String(); !strings.Contains(tp0, want) {
		t.Fatalf("batch's traceparent %q, want the span's trace %s", tp0, want)
	}
}

// TestSubmitManySendsOpenOutcomesAgain: a submission of a batch answered by a
// coordinator that stopped serving meanwhile (its lease lapsed while the job's write
// went on), or that could not tell yet whether its job was stored, is sent once more
// alone of the batch, under its own request id and marked as a send again, as Submit
// sends it again; its result is what that send hears. Still open, it is Outcome
// unknown naming its own job, never the refusal, which would say that nothing was
// stored.
func TestSubmitManySendsOpenOutcomesAgain(t *testing.T) {
	t.Parallel()
	notServing := &protocol.Error{Message: coordinator.ErrNotServing.Error() + ": its leader lease lapsed"}
	for _, tc := range []struct {
		name  string
		first protocol.Message                  // the second submission's first answer
		again func(rid string) protocol.Message // its answer when sent again
		check func(t *testing.T, r client.SubmitResult, rid string)
	}{
		{"NotServingThenStored", notServing,
			func(rid string) protocol.Message { return &protocol.JobSubmitted{JobID: protocol.RequestJobID(rid)} },
			func(t *testing.T, r client.SubmitResult, rid string) {
				if r.Err != nil || r.JobID != protocol.RequestJobID(rid) {
					t.Fatalf("second: %+v, want its job %s", r, protocol.RequestJobID(rid))
				}
			}},
		{"UnknownThenNotStored", protocol.OutcomeUnknown("submission", "j", "not confirmed in time"),
			func(string) protocol.Message { return protocol.AtCapacity(10, 10) },
			func(t *testing.T, r client.SubmitResult, _ string) {
				if !errors.Is(r.Err, client.ErrRejected) || errors.Is(r.Err, client.ErrOutcomeUnknown) {
					t.Fatalf("second: %v, want its rejection", r.Err)
				}
			}},
		{"StillOpen", notServing,
			func(string) protocol.Message { return notServing },
			func(t *testing.T, r client.SubmitResult, rid string) {
				job, ok := client.OutcomeJob(r.Err)
				if !errors.Is(r.Err, client.ErrOutcomeUnknown) || !ok || job != protocol.RequestJobID(rid) {
					t.Fatalf("second: %v (job %q), want Outcome unknown naming %s", r.Err, job, protocol.RequestJobID(rid))
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			nc := jobbustest.Start(t, jobbustest.WithoutCoordinator()).NC
			var mu sync.Mutex
			var batches [][]string
			var tries []string
			sub, err := nc.Subscribe(submitManySubject, func(m *nats.Msg) {
				rids := batchRequestIDs(t, m.Data)
				mu.Lock()
				batches = append(batches, rids)
				tries = append(tries, m.Header.Get(protocol.HeaderRequestTry))
				n := len(batches)
				mu.Unlock()
				answers := []protocol.Message{tc.again(rids[0])}
				if n == 1 {
					answers = []protocol.Message{&protocol.JobSubmitted{JobID: protocol.RequestJobID(rids[0])}, tc.first}
				}
				var raw []json.RawMessage
				for _, a := range answers {
					raw = append(raw, mustEncode(a))
				}
				_ = m.Respond(mustEncode(&protocol.JobsSubmitted{Answers: raw}))
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			res, err := client.New(nc).SubmitMany(context.Background(), make([]client.Submission, 2))
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(batches) != 2 || len(batches[0]) != 2 || fmt.Sprint(batches[1]) != fmt.Sprint(batches[0][1:]) {
				t.Fatalf("batches %v: want the second submission sent again alone under its request id", batches)
			}
			if tries[0] != "" || protocol.FirstTry(tries[1]) {
				t.Fatalf("%s headers %q: want the second batch marked as a send again", protocol.HeaderRequestTry, tries)
			}
			if res[0].Err != nil || res[0].JobID != protocol.RequestJobID(batches[0][0]) {
				t.Fatalf("first: %+v", res[0])
			}
			tc.check(t, res[1], batches[0][1])
		})
	}
}
