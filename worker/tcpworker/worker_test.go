package tcpworker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker/tcpworker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// running is a worker whose Run goroutine the test owns.
type running struct {
	*tcpworker.Worker
	cancel context.CancelFunc
	done   chan error
}

// stop ends Run and returns its error; it may be called more than once.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	return r.wait(t)
}

// wait waits for Run to return by itself and returns its error.
func (r *running) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for a later call
		return err
	case <-time.After(waitLimit):
		t.Fatal("Run did not return")
		return nil
	}
}

// startWorker runs a worker against addr with millisecond timings until the test ends.
func startWorker(t *testing.T, addr string, opts ...tcpworker.Option) *running {
	t.Helper()
	opts = append([]tcpworker.Option{
		tcpworker.WithLogger(nil),
		tcpworker.WithHeartbeat(50 * time.Millisecond),
		tcpworker.WithReconnectDelay(50 * time.Millisecond),
		tcpworker.WithDialTimeout(5 * time.Second),
	}, opts...)
	w, err := tcpworker.New(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Worker: w, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- w.Run(ctx) }()
	t.Cleanup(func() { _ = r.stop(t) })
	return r
}

func assign(job, attempt string, number int, taskType, payload string) *protocol.TaskAssign {
	return &protocol.TaskAssign{JobID: job, AttemptID: attempt, AttemptNumber: number, TaskType: taskType, Payload: json.RawMessage(payload)}
}

func TestNewValidatesOptions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		addr string
		opts []tcpworker.Option
		want string // "" means valid
	}{
		{"Defaults", "127.0.0.1:7070", nil, ""},
		{"LimitsOfCapacity", "127.0.0.1:7070", []tcpworker.Option{tcpworker.WithCapacity(1024)}, ""},
		{"NoAddress", "", nil, "address is empty"},
		{"CapacityZero", "h:1", []tcpworker.Option{tcpworker.WithCapacity(0)}, "capacity must be in 1..1024, got 0"},
		{"CapacityTooLarge", "h:1", []tcpworker.Option{tcpworker.WithCapacity(1025)}, "capacity must be in 1..1024, got 1025"},
		{"NoHeartbeat", "h:1", []tcpworker.Option{tcpworker.WithHeartbeat(0)}, "heartbeat interval must be positive"},
		{"NoReconnectDelay", "h:1", []tcpworker.Option{tcpworker.WithReconnectDelay(0)}, "reconnect delay must be positive"},
		{"NoDialTimeout", "h:1", []tcpworker.Option{tcpworker.WithDialTimeout(-time.Second)}, "dial timeout must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := tcpworker.New(tt.addr, tt.opts...)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("New: error %v, want it to contain %q", err, tt.want)
			}
		})
	}
	t.Run("ReportsEveryProblem", func(t *testing.T) {
		t.Parallel()
		_, err := tcpworker.New("", tcpworker.WithCapacity(0), tcpworker.WithHeartbeat(0))
		for _, want := range []string{"address", "capacity", "heartbeat"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("error %v does not mention %s", err, want)
			}
		}
	})
}

func TestDefaultID(t *testing.T) {
	t.Parallel()
	a, err := tcpworker.New("127.0.0.1:7070")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := tcpworker.New("127.0.0.1:7070")
	if !regexp.MustCompile(`^worker-[0-9a-f]{8}$`).MatchString(a.ID()) {
		t.Errorf("default id %q, want worker-<8 hex>", a.ID())
	}
	if a.ID() == b.ID() {
		t.Errorf("two workers share the default id %q", a.ID())
	}
}

func TestRegistersFirst(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	w := startWorker(t, p.addr(), tcpworker.WithID("worker-reg"), tcpworker.WithCapacity(3))
	reg := p.accept().expectRegister()
	if reg.WorkerID != "worker-reg" || reg.Capacity != 3 {
		t.Fatalf("registered as %q with capacity %d, want worker-reg with 3", reg.WorkerID, reg.Capacity)
	}
	if reg.TaskTypes != nil {
		t.Errorf("a spec worker sent the native taskTypes extension: %v", reg.TaskTypes)
	}
	if w.ID() != "worker-reg" {
		t.Errorf("ID() = %q", w.ID())
	}
}

func TestHeartbeatsAtTheInterval(t *testing.T) {
	t.Parallel()
	const interval = 40 * time.Millisecond
	const beats = 4
	p := newPeer(t)
	startWorker(t, p.addr(), tcpworker.WithID("worker-hb"), tcpworker.WithHeartbeat(interval))
	pc := p.accept()
	// The worker starts its ticker only once it has the acknowledgement, so the n-th
	// beat cannot arrive sooner than n intervals after the acknowledgement was sent:
	// taken before register sends it, as the time after it returns may be later.
	acked := time.Now()
	pc.register()
	for i := 1; i <= beats; i++ {
		r := pc.next()
		hb, ok := r.m.(*protocol.Heartbeat)
		if !ok {
			t.Fatalf("frame %d is %s, want HEARTBEAT", i, r.m.MessageType())
		}
		if hb.WorkerID != "worker-hb" {
			t.Fatalf("heartbeat names %q", hb.WorkerID)
		}
		if got, least := r.at.Sub(acked), time.Duration(i)*interval; got < least {
			t.Fatalf("heartbeat %d came %v after registration, before %v: interval not honoured", i, got, least)
		}
	}
}

func TestResultsEchoTheLease(t *testing.T) {
	t.Parallel()
	type want struct {
		success bool
		result  string // for success
		err     string // for failure, a substring
	}
	tests := []struct {
		name   string
		assign *protocol.TaskAssign
		want   want
	}{
		{"SHA256", assign("job-1", "att-1", 1, "SHA256", `{"text":"hello"}`),
			want{true, "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824", ""}},
		{"WordCount", assign("job-2", "att-2", 1, "WORD_COUNT", `{"text":"the quick  brown\tfox"}`), want{true, "4", ""}},
		{"WordCountEmpty", assign("job-3", "att-3", 2, "WORD_COUNT", `{"text":""}`), want{true, "0", ""}},
		{"FailBeforeItsAttempt", assign("job-4", "att-4", 1, "FAIL", `{"failUntilAttempt":3}`),
			want{false, "", "deliberate failure on attempt 1 (failing until 3)"}},
		{"FailReachesItsAttempt", assign("job-5", "att-5", 3, "FAIL", `{"failUntilAttempt":3}`), want{true, "succeeded on attempt 3", ""}},
		{"UnknownTaskType", assign("job-6", "att-6", 1, "RESIZE_IMAGE", `{}`), want{false, "", "unknown task type"}},
	}
	p := newPeer(t)
	startWorker(t, p.addr(), tcpworker.WithID("worker-res"), tcpworker.WithCapacity(len(tests)))
	pc := p.accept()
	pc.register()
	for _, tt := range tests {
		pc.send(tt.assign)
	}
	got := make(map[string]*protocol.TaskResult)
	for range tests {
		res := pc.nextResult("worker-res")
		got[res.AttemptID] = res
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := got[tt.assign.AttemptID]
			switch {
			case res == nil:
				t.Fatalf("no result for attempt %s", tt.assign.AttemptID)
			case res.WorkerID != "worker-res" || res.JobID != tt.assign.JobID:
				t.Fatalf("result %+v does not echo worker and job", res)
			case res.Success != tt.want.success:
				t.Fatalf("success = %v, want %v (error %v)", res.Success, tt.want.success, deref(res.Error))
			case tt.want.success && (res.Result == nil || *res.Result != tt.want.result || res.Error != nil):
				t.Fatalf("result %q error %q, want result %q", deref(res.Result), deref(res.Error), tt.want.result)
			case !tt.want.success && (res.Error == nil || !strings.Contains(*res.Error, tt.want.err) || res.Result != nil):
				t.Fatalf("result %q error %q, want error containing %q", deref(res.Result), deref(res.Error), tt.want.err)
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// TestFramesNeverInterleave runs many attempts whose results race with fast heartbeats
// on one connection: every frame the peer reads must decode.
func TestFramesNeverInterleave(t *testing.T) {
	t.Parallel()
	const n = 200
	p := newPeer(t)
	startWorker(t, p.addr(), tcpworker.WithID("worker-many"), tcpworker.WithHeartbeat(time.Millisecond))
	pc := p.accept()
	pc.register()
	for i := range n {
		pc.send(assign(fmt.Sprint("job-", i), fmt.Sprint("att-", i), 1, "SHA256", fmt.Sprintf(`{"text":"%s"}`, strings.Repeat("x", i*100))))
	}
	seen := make(map[string]bool)
	for range n {
		res := pc.nextResult("worker-many")
		if !res.Success || seen[res.AttemptID] {
			t.Fatalf("bad or repeated result %+v", res)
		}
		seen[res.AttemptID] = true
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	w := startWorker(t, p.addr(), tcpworker.WithID("worker-cancel"), tcpworker.WithCapacity(2))
	pc := p.accept()
	pc.register()
	pc.send(assign("job-a", "att-a1", 1, "SLEEP", `{"durationMillis":30000}`))
	pc.send(assign("job-b", "att-b1", 1, "SLEEP", `{"durationMillis":30000}`))
	testkit.Eventually(t, waitLimit, "two attempts running at once", func() bool { return w.Running() == 2 })

	// Cancels naming a superseded attempt of the job, or the attempt under another job.
	pc.send(&protocol.TaskCancel{JobID: "job-a", AttemptID: "att-a0"})
	pc.send(&protocol.TaskCancel{JobID: "job-x", AttemptID: "att-a1"})
	// The worker reads frames in order: once the marker's result is back, both
	// cancels have been handled.
	pc.send(assign("job-m", "att-m1", 1, "SHA256", `{"text":""}`))
	if res := pc.nextResult("worker-cancel"); res.AttemptID != "att-m1" {
		t.Fatalf("a non-matching cancel ended %s/%s", res.JobID, res.AttemptID)
	}
	if got := w.Running(); got != 2 {
		t.Fatalf("Running() = %d after non-matching cancels, want 2", got)
	}

	pc.send(&protocol.TaskCancel{JobID: "job-a", AttemptID: "att-a1"})
	res := pc.nextResult("worker-cancel") // within waitLimit, a third of the sleep
	if res.JobID != "job-a" || res.AttemptID != "att-a1" || res.Success || res.Result != nil {
		t.Fatalf("result after cancel: %+v", res)
	}
	if !strings.Contains(deref(res.Error), "cancelled") {
		t.Errorf("error of a cancelled attempt: %q", deref(res.Error))
	}
	testkit.Eventually(t, waitLimit, "one attempt left", func() bool { return w.Running() == 1 })
}

func TestConnectionLoss(t *testing.T) {
	t.Parallel()
	const delay = 100 * time.Millisecond
	p := newPeer(t)
	w := startWorker(t, p.addr(), tcpworker.WithID("worker-loss"), tcpworker.WithCapacity(2), tcpworker.WithReconnectDelay(delay))
	pc := p.accept()
	pc.register()
	pc.send(assign("job-1", "att-1", 1, "SLEEP", `{"durationMillis":30000}`))
	testkit.Eventually(t, waitLimit, "the attempt running", func() bool { return w.Running() == 1 })

	lost := time.Now()
	pc.close()
	testkit.Eventually(t, waitLimit, "the attempt interrupted", func() bool { return w.Running() == 0 })

	pc2 := p.accept()
	if waited := pc2.acceptedAt.Sub(lost); waited < delay {
		t.Errorf("worker redialled %v after the loss, before the reconnect delay %v", waited, delay)
	}
	reg := pc2.expectRegister()
	if reg.WorkerID != "worker-loss" || reg.Capacity != 2 {
		t.Fatalf("re-registered as %+v", reg)
	}
	pc2.send(&protocol.WorkerRegistered{WorkerID: reg.WorkerID})
	// The interrupted attempt's result was dropped: the first result is the new one.
	pc2.send(assign("job-2", "att-2", 1, "WORD_COUNT", `{"text":"a b"}`))
	if res := pc2.nextResult("worker-loss"); res.AttemptID != "att-2" || deref(res.Result) != "2" {
		t.Fatalf("first result after reconnecting: %+v", res)
	}
}

func TestRegistrationError(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	w := startWorker(t, p.addr())
	pc := p.accept()
	pc.expectRegister()
	bad := protocol.BadRegistration()
	pc.send(bad)
	pc.close()
	err := w.wait(t) // Run returns by itself, its context still live
	if !errors.Is(err, tcpworker.ErrRegistrationRefused) || !strings.Contains(err.Error(), bad.Message) {
		t.Fatalf("Run returned %v, want ErrRegistrationRefused naming %q", err, bad.Message)
	}
	select {
	case <-p.conns:
		t.Fatal("worker dialled again after a refused registration")
	default:
	}
}

func TestBadFramesDropTheConnection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		payload string
	}{
		{"NotJSON", `hello`},
		{"UnknownType", `{"type":"TASK_PAUSE","jobId":"j"}`},
		{"ClientPortType", `{"type":"JOB_SUBMITTED","jobId":"j"}`},
		{"WorkerToCoordinatorType", `{"type":"HEARTBEAT","workerId":"w"}`},
		{"WrongFieldType", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":"1","taskType":"SLEEP","payload":{}}`},
		{"AssignWithoutLease", `{"type":"TASK_ASSIGN","jobId":"","attemptId":"","attemptNumber":1,"taskType":"SLEEP","payload":{}}`},
		{"Error", `{"type":"ERROR","message":"something broke"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := newPeer(t)
			startWorker(t, p.addr(), tcpworker.WithID("worker-bad"))
			pc := p.accept()
			pc.register()
			pc.sendRaw([]byte(tt.payload))
			pc.waitClosed()
			if reg := p.accept().expectRegister(); reg.WorkerID != "worker-bad" {
				t.Fatalf("re-registered as %q", reg.WorkerID)
			}
		})
	}
}

func TestIgnoresRepeatedRegistered(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	startWorker(t, p.addr(), tcpworker.WithID("worker-rep"))
	pc := p.accept()
	pc.register()
	pc.send(&protocol.WorkerRegistered{WorkerID: "worker-rep"})
	pc.send(assign("job-1", "att-1", 1, "WORD_COUNT", `{"text":"x"}`))
	if res := pc.nextResult("worker-rep"); res.AttemptID != "att-1" || !res.Success {
		t.Fatalf("result %+v", res)
	}
}

func TestStopInterruptsAttempts(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	w := startWorker(t, p.addr(), tcpworker.WithID("worker-stop"))
	pc := p.accept()
	pc.register()
	pc.send(assign("job-1", "att-1", 1, "SLEEP", `{"durationMillis":30000}`))
	testkit.Eventually(t, waitLimit, "the attempt running", func() bool { return w.Running() == 1 })
	if err := w.stop(t); err != nil {
		t.Fatalf("Run returned %v after its context ended", err)
	}
	if got := w.Running(); got != 0 {
		t.Fatalf("Running() = %d after Run returned", got)
	}
	pc.waitClosed() // and no result on the way
	if err := w.Run(context.Background()); !errors.Is(err, tcpworker.ErrStarted) {
		t.Fatalf("second Run returned %v, want ErrStarted", err)
	}
}

func TestRedialsUntilTheCoordinatorAnswers(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	var dials atomic.Int32
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials.Add(1) <= 2 {
			return nil, errors.New("connection refused (test)")
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	startWorker(t, p.addr(), tcpworker.WithID("worker-dial"), tcpworker.WithDialer(dial))
	if reg := p.accept().expectRegister(); reg.WorkerID != "worker-dial" {
		t.Fatalf("registered as %q", reg.WorkerID)
	}
	if got := dials.Load(); got != 3 {
		t.Fatalf("%d dials, want 3", got)
	}
}

func TestRegistrationTimesOut(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	// The timeout also bounds the second, answered handshake, so it must be long
	// enough for that one to finish on a loaded CI machine running -race.
	startWorker(t, p.addr(), tcpworker.WithID("worker-slow"), tcpworker.WithDialTimeout(time.Second))
	pc := p.accept()
	pc.expectRegister() // and never answered
	pc.waitClosed()
	p.accept().register()
}

// TestRunsWhatItIsSent checks the worker runs assignments beyond its announced
// capacity: the coordinator counts capacity, the worker does not second-guess it.
func TestRunsWhatItIsSent(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	w := startWorker(t, p.addr(), tcpworker.WithCapacity(1))
	pc := p.accept()
	pc.register()
	for i := range 3 {
		pc.send(assign(fmt.Sprint("job-", i), "att", 1, "SLEEP", `{"durationMillis":30000}`))
	}
	testkit.Eventually(t, waitLimit, "three attempts running", func() bool { return w.Running() == 3 })
}
