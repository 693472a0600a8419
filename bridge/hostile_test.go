package bridge_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
	"github.com/jobbus/jobbus/internal/testkit/specpeer"
)

// hostile is one hostile input of issue 9's table and what it must cost: the reply
// the peer gets (the start of an ERROR's text, or the type of a legal reply), and
// whether the bridge then closes the connection. Nothing else may change.
type hostile struct {
	name string
	// worker: sent on the worker port, after a valid registration when registered.
	worker, registered bool
	send               []byte
	// want is the reply: "ERROR:<prefix>" or a message type; "" for none (the bridge
	// closes without a word, as on a stalled frame).
	want   string
	closes bool
}

// deep is a JSON value nested n arrays deep.
func deep(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }

func hostileInputs() []hostile {
	submit := func(payload string, extra string) []byte {
		return framed(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":` + payload + `,"maxAttempts":0` + extra + `}`)
	}
	submitAs := func(taskType, payload string) []byte {
		return framed(`{"type":"SUBMIT_JOB","taskType":"` + taskType + `","payload":` + payload + `}`)
	}
	register := func(fields string) []byte { return framed(`{"type":"WORKER_REGISTER",` + fields + `}`) }
	result := func(fields string) []byte {
		return framed(`{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a",` + fields + `}`)
	}
	const malformed = "ERROR:Malformed request: "
	text := `{"text":"` + strings.Repeat("x", 200_001) + `"}`
	oneMiB := 1 << 20
	return []hostile{
		// Lengths.
		{name: "Length0", send: header(0), want: malformed + "frame: length must be positive", closes: true},
		{name: "LengthMinus1", send: header(0xFFFFFFFF), want: malformed + "frame: length must be positive", closes: true},
		{name: "Length2^31-1", send: append(header(1<<31-1), "{}"...), want: malformed + "frame: payload too large", closes: true},
		{name: "Length1MiB+1", send: append(header(uint32(oneMiB+1)), bytes.Repeat([]byte(" "), 4096)...), want: malformed + "frame: payload too large", closes: true},
		{name: "Length0", worker: true, send: header(0), want: malformed + "frame: length must be positive", closes: true},
		{name: "LengthMinus1", worker: true, registered: true, send: header(0xFFFFFFFF), want: malformed + "frame: length must be positive", closes: true},
		{name: "Length2^31-1", worker: true, send: append(header(1<<31-1), "{}"...), want: malformed + "frame: payload too large", closes: true},
		{name: "Length1MiB+1", worker: true, registered: true, send: header(uint32(oneMiB + 1)), want: malformed + "frame: payload too large", closes: true},
		// Nesting: within the decoder's limit it is a payload like any other; beyond it,
		// undecodable.
		{name: "Nesting10000InPayload", send: submit(`{"text":"a","x":`+deep(10_000)+`}`, ""), want: malformed, closes: true},
		{name: "Nesting9000InPayload", send: submit(`{"text":"a","x":`+deep(9_000)+`}`, ""), want: "JOB_SUBMITTED"},
		{name: "Nesting10000AsPayload", send: submitAs("SLEEP", deep(10_000)), want: malformed, closes: true},
		{name: "Nesting10000", worker: true, send: register(`"workerId":"w","capacity":1,"x":` + deep(10_000)), want: malformed, closes: true},
		{name: "Nesting10000InResult", worker: true, registered: true, send: result(`"success":true,"result":"r","x":` + deep(10_000)), want: malformed, closes: true},
		// Text encodings.
		{name: "InvalidUTF8InText", send: submit("{\"text\":\"\xff\xfe\xc3\"}", ""), want: "JOB_SUBMITTED"},
		{name: "InvalidUTF8InJobID", send: framed("{\"type\":\"GET_JOB_STATUS\",\"jobId\":\"\xff\xfe\"}"), want: "ERROR:Unknown job: \ufffd\ufffd"},
		{name: "InvalidUTF8WorkerID", worker: true, send: register("\"workerId\":\"\xff\xfe\",\"capacity\":1"), want: "WORKER_REGISTERED"},
		{name: "NULRaw", send: framed("{\"type\":\"GET_JOB_STATUS\",\"jobId\":\"a\x00b\"}"), want: malformed, closes: true},
		{name: "NULEscapedInText", send: submit(`{"text":"a\u0000b"}`, ""), want: "JOB_SUBMITTED"},
		{name: "NULBytesOnly", send: append(header(8), make([]byte, 8)...), want: malformed, closes: true},
		{name: "NULRaw", worker: true, send: register("\"workerId\":\"a\x00b\",\"capacity\":1"), want: malformed, closes: true},
		{name: "NULEscapedWorkerID", worker: true, send: register(`"workerId":"a\u0000b","capacity":1`), want: "WORKER_REGISTERED"},
		// Numbers.
		{name: "NumberAsStringInPayload", send: submitAs("SLEEP", `{"durationMillis":"5"}`), want: "ERROR:Invalid payload: Field 'durationMillis' must be an integer"},
		{name: "NumberAsStringMaxAttempts", send: submit(`{"text":"a"}`, `,"maxAttempts":"3"`), want: malformed, closes: true},
		{name: "FloatInPayload", send: submitAs("PRIME_COUNT", `{"limit":10.0}`), want: "ERROR:Invalid payload: Field 'limit' must be an integer"},
		{name: "ExponentInPayload", send: submitAs("PRIME_COUNT", `{"limit":1e3}`), want: "ERROR:Invalid payload: Field 'limit' must be an integer"},
		{name: "FloatMaxAttempts", send: framed(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"a"},"maxAttempts":1.5}`), want: malformed, closes: true},
		{name: "BeyondInt64InPayload", send: submitAs("FAIL", `{"failUntilAttempt":9223372036854775808}`), want: "ERROR:Invalid payload: Field 'failUntilAttempt' must be an integer"},
		{name: "BeyondInt64MaxAttempts", send: framed(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"a"},"maxAttempts":9223372036854775808}`), want: malformed, closes: true},
		{name: "NumberAsString", worker: true, send: register(`"workerId":"w","capacity":"4"`), want: malformed, closes: true},
		{name: "Float", worker: true, send: register(`"workerId":"w","capacity":4.0`), want: malformed, closes: true},
		{name: "Exponent", worker: true, send: register(`"workerId":"w","capacity":4e0`), want: malformed, closes: true},
		{name: "BeyondInt64", worker: true, send: register(`"workerId":"w","capacity":9223372036854775808`), want: malformed, closes: true},
		{name: "Capacity2^31", worker: true, send: register(`"workerId":"w","capacity":2147483648`), want: "ERROR:Registration requires a worker id and capacity in 1..1024", closes: true},
		// Duplicate keys: the last one counts, as in encoding/json and the reference.
		{name: "DuplicateKeys", send: framed(`{"type":"GET_JOB_STATUS","jobId":"a","jobId":"b"}`), want: "ERROR:Unknown job: b"},
		{name: "DuplicateType", send: framed(`{"type":"HEARTBEAT","type":"LIST_WORKERS"}`), want: "WORKER_LIST"},
		{name: "DuplicateKeys", worker: true, send: register(`"workerId":"w","capacity":0,"capacity":1`), want: "WORKER_REGISTERED"},
		// Big texts.
		{name: "Text200001", send: submit(text, ""), want: "ERROR:Invalid payload: Field 'text' exceeds 200000 characters"},
		{name: "Text200000", send: submit(`{"text":"`+strings.Repeat("x", 200_000)+`"}`, ""), want: "JOB_SUBMITTED"},
		{name: "WorkerID200001", worker: true, send: register(`"workerId":"` + strings.Repeat("w", 200_001) + `","capacity":1`), want: "ERROR:Registration requires", closes: true},
		{name: "Result200001", worker: true, registered: true, send: result(`"success":true,"result":"` + strings.Repeat("r", 200_001) + `"`), want: ""},
		// A stalled half frame: closed without a word after the stall timeout.
		{name: "StalledHalfFrame", send: append(header(100), `{"type":"LIST`...), closes: true},
		{name: "StalledHalfFrame", worker: true, registered: true, send: append(header(100), `{"type":"HEART`...), closes: true},
		{name: "StalledHeader", worker: true, send: []byte{0, 0}, closes: true},
	}
}

// TestHostileInputs sends issue 9's hostile inputs to both ports while a healthy
// worker completes jobs submitted through the client port all along: each costs only
// its own request or connection. Then 2,000 connections open at once, 10,000 workers
// of distinct ids register (and go), and a client and a worker pipeline requests they
// never read the replies of; the process's heap stays bounded throughout.
//
// It runs alone (not in parallel with the package's other tests): 14,000 connections
// in a minute would starve their millisecond heartbeats.
func TestHostileInputs(t *testing.T) {
	s := setup(t, withBridge(func(c *bridgeConfig) {
		c.FrameStallTimeout = time.Second
		c.WriteTimeout = 500 * time.Millisecond
		c.RequestTimeout = waitFor // generous: the machine is shared
	}))
	s.specWorker("healthy", 4)
	s.healthy(2)
	completed := s.keepBusy(t)
	mem := watchHeap(t, completed)

	t.Run("table", func(t *testing.T) {
		for _, h := range hostileInputs() {
			port := "client"
			if h.worker {
				port = "worker"
				if h.registered {
					port = "registered"
				}
			}
			t.Run(port+"/"+h.name, func(t *testing.T) {
				t.Parallel()
				s.checkHostile(t, h)
			})
		}
	})
	mem.phase(t, "table")
	t.Run("2000ConnectionsAtOnce", func(t *testing.T) {
		for _, addr := range []net.Addr{s.br.ClientAddr(), s.br.WorkerAddr()} {
			s.manyConnections(t, addr, 2000)
		}
	})
	mem.phase(t, "2000 connections at once, on each port")
	t.Run("10000WorkerIDs", func(t *testing.T) {
		s.manyWorkers(t, 10_000)
	})
	mem.phase(t, "10,000 worker ids")
	t.Run("NeverReadsReplies", func(t *testing.T) {
		s.neverReads(t)
	})

	mem.phase(t, "a client that never reads")
	before := completed.Load()
	s.healthy(3)
	eventually(t, "jobs still completing after the attacks", func() bool { return completed.Load() > before })
	if !s.hasWorker("healthy") {
		t.Fatal("the healthy worker was lost")
	}
	mem.stop()
	peak := mem.all.Load()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("heap in use: %d MiB before the attacks, peak %d MiB (+%d MiB), %d MiB after them and a GC; %d jobs completed meanwhile",
		mem.base>>20, peak>>20, (max(peak, mem.base)-mem.base)>>20, ms.HeapInuse>>20, completed.Load())
	// What stays is the coordinator's jobs (about a thousand, one of 200,000
	// characters), not the peers'.
	// A heap smaller after than before is fine (and would wrap the subtraction).
	if limit := uint64(64 << 20); ms.HeapInuse > mem.base && ms.HeapInuse-mem.base > limit {
		t.Errorf("%d MiB more heap in use after the attacks than before, more than %d MiB", (ms.HeapInuse-mem.base)>>20, limit>>20)
	}
	// The test itself holds its inputs (a few MiB) and both ends of 2,000 connections.
	if limit := uint64(256 << 20); max(peak, mem.base)-mem.base > limit {
		t.Errorf("heap grew by %d MiB, more than %d MiB", (max(peak, mem.base)-mem.base)>>20, limit>>20)
	}
}

func (s *system) checkHostile(t *testing.T, h hostile) {
	addr := s.br.ClientAddr()
	if h.worker {
		addr = s.br.WorkerAddr()
	}
	p := dial(t, addr)
	if h.registered {
		p.Register("hostile-"+strings.ReplaceAll(t.Name(), "/", "-"), 1)
	}
	// Write from a goroutine: the bridge may close (after its ERROR) before it has
	// read a large input, and a blocked write must not keep the reply unread.
	wrote := make(chan error, 1)
	go func() { wrote <- p.Write(h.send) }()
	defer func() { <-wrote }()
	// A registered peer is a worker with a free slot: while the healthy one is busy,
	// the coordinator may assign it a job before, or after, the bridge answers its
	// input. Only anything else is wrong.
	assigned := func(b []byte) bool {
		typ, err := protocol.PeekType(b)
		return h.registered && err == nil && typ == protocol.TypeTaskAssign
	}
	var frames [][]byte
	if h.want != "" {
		b, err := p.RecvRaw()
		for err == nil && assigned(b) {
			b, err = p.RecvRaw()
		}
		if err != nil {
			t.Fatalf("no reply: %v", err)
		}
		frames = append(frames, b)
		m, err := protocol.Decode(b)
		if err != nil {
			t.Fatalf("bridge wrote %q: %v", b, err)
		}
		if e, ok := m.(*protocol.Error); ok {
			if !strings.HasPrefix("ERROR:"+e.Message, h.want) {
				t.Fatalf("got ERROR %q, want %q", e.Message, h.want)
			}
		} else if string(m.MessageType()) != h.want {
			t.Fatalf("got %s %.200s, want %s", m.MessageType(), b, h.want)
		}
	}
	if h.closes {
		more := slices.DeleteFunc(p.ExpectClosed(), assigned)
		if len(more) > 0 {
			t.Fatalf("frames after %v: %q", frames, more)
		}
		return
	}
	// The connection lives on: it is served as if nothing happened.
	if h.worker {
		p.MustSend(&protocol.Heartbeat{WorkerID: "ignored"})
		return // a heartbeat gets no reply; the next check is the close below
	}
	if _, ok := p.Request(&protocol.ListWorkers{}).(*protocol.WorkerList); !ok {
		t.Fatal("the connection was not served after the hostile input")
	}
}

// keepBusy submits a job through the client port every few milliseconds until the test
// ends, and counts those completed; a failed submission fails the test.
func (s *system) keepBusy(t *testing.T) *atomic.Int64 {
	var completed atomic.Int64
	p := dial(t, s.br.ClientAddr())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() }) // before the peer's cleanup closes it
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ids []string
		for i := 0; ctx.Err() == nil; i++ {
			// Fake workers (the crowd, the 10,000) take jobs and vanish: each such
			// attempt counts, so the job gets many.
			err := p.Send(&protocol.SubmitJob{TaskType: "SHA256", Payload: fmt.Appendf(nil, `{"text":"busy %d"}`, i), MaxAttempts: 1000})
			var m protocol.Message
			if err == nil {
				m, err = p.Recv()
			}
			if err != nil || m.MessageType() != protocol.TypeJobSubmitted {
				if ctx.Err() == nil {
					t.Errorf("submit during the attacks: %v %v", m, err)
				}
				return
			}
			ids = append(ids, m.(*protocol.JobSubmitted).JobID)
			for len(ids) > 0 {
				j, err := s.native.Status(ctx, ids[0])
				if err != nil || !j.State.Terminal() {
					break
				}
				if j.State == protocol.StateCompleted {
					completed.Add(1)
				}
				ids = ids[1:]
			}
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return &completed
}

// heapWatch samples the heap in use every 20 ms until the test ends.
type heapWatch struct {
	// completed counts the jobs the healthy worker completed; phase reports them.
	completed *atomic.Int64
	last      int64
	since     time.Time
	base      uint64 // after a GC, before the attacks
	peak      atomic.Uint64
	all       atomic.Uint64
	stop      func()
}

func watchHeap(t *testing.T, completed *atomic.Int64) *heapWatch {
	read := func() uint64 {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	runtime.GC()
	h := &heapWatch{base: read(), completed: completed, since: time.Now()}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				v := read()
				for p := h.peak.Load(); v > p && !h.peak.CompareAndSwap(p, v); p = h.peak.Load() {
				}
				for p := h.all.Load(); v > p && !h.all.CompareAndSwap(p, v); p = h.all.Load() {
				}
			}
		}
	}()
	h.stop = sync.OnceFunc(func() { close(done); <-stopped })
	t.Cleanup(h.stop)
	return h
}

// phase logs the peak heap since the last phase, above the base, and the jobs
// completed meanwhile, and starts anew. A phase of seconds without a completed job
// fails the test: the healthy worker must keep completing jobs throughout.
func (h *heapWatch) phase(t *testing.T, name string) {
	t.Helper()
	p := h.peak.Swap(0)
	done, took := h.completed.Load(), time.Since(h.since)
	t.Logf("%s: %v, peak heap %d MiB (+%d MiB), %d jobs completed", name, took.Round(time.Millisecond), p>>20, (max(p, h.base)-h.base)>>20, done-h.last)
	if done == h.last && took > 3*time.Second {
		t.Errorf("%s: no job completed in %v", name, took)
	}
	h.last, h.since = done, time.Now()
}

// manyConnections opens n connections to addr at once: the port admits up to its limit
// (1024) and refuses the rest with an ERROR, and every admitted one is served.
func (s *system) manyConnections(t *testing.T, addr net.Addr, n int) {
	worker := addr.String() == s.br.WorkerAddr().String()
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	peers := make([]*peer, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c, err := net.DialTimeout("tcp", addr.String(), waitFor)
			if err != nil {
				t.Errorf("dial %d: %v", i, err)
				return
			}
			p := usePeer(t, c)
			peers[i] = p
			// A refused connection may be closed before the request is written: the
			// reply (or the close) says which it was.
			if worker {
				_ = p.Send(&protocol.WorkerRegister{WorkerID: fmt.Sprintf("crowd-%d", i), Capacity: 1})
			} else {
				_ = p.Send(&protocol.ListWorkers{})
			}
			m, rerr := p.Recv()
			switch e, isErr := m.(*protocol.Error); {
			case rerr != nil && isClosedErr(rerr):
				// Refused: its ERROR is best effort, and a reset may destroy it.
				refused.Add(1)
			case rerr != nil:
				t.Errorf("connection %d: %v", i, rerr)
			case isErr && e.Message == "too many connections (limit 1024)":
				refused.Add(1)
			case m.MessageType() == protocol.TypeWorkerList || m.MessageType() == protocol.TypeWorkerRegistered:
				admitted.Add(1)
			default:
				t.Errorf("connection %d: got %+v", i, m)
			}
		}()
	}
	close(start)
	wg.Wait()
	t.Logf("%s port: %d connections at once: %d admitted, %d refused", map[bool]string{true: "worker", false: "client"}[worker], n, admitted.Load(), refused.Load())
	if a := admitted.Load(); a < 900 || a > 1024 || a+refused.Load() != int64(n) {
		t.Errorf("%d admitted and %d refused of %d, want up to the limit (1024) admitted and the rest refused", a, refused.Load(), n)
	}
	for _, p := range peers {
		if p != nil {
			_ = p.Close()
		}
	}
	if worker {
		eventually(t, "the crowd gone", func() bool {
			ws, err := s.native.Workers(context.Background())
			return err == nil && len(ws) < 50
		})
	}
}

// manyWorkers registers n workers of distinct ids, each on a connection of its own
// that then closes: the coordinator forgets each, and its list ends as it began.
func (s *system) manyWorkers(t *testing.T, n int) {
	const parallel = 8
	var next, resets atomic.Int64
	var wg sync.WaitGroup
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n) && !t.Failed(); i = next.Add(1) {
				id := fmt.Sprintf("many-%05d", i)
				for try := 0; ; try++ {
					err := registerOnce(s.br.WorkerAddr(), id)
					if err == nil {
						break
					}
					if !isClosedErr(err) || try == 2 {
						t.Errorf("register %s: %v", id, err)
						return
					}
					// A registration must begin within the stall timeout: on a loaded
					// machine the test's own write is late now and then, and the
					// bridge closes the connection ("frame stalled: no frame within").
					resets.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	eventually(t, "the registered workers gone", func() bool {
		ws, err := s.native.Workers(context.Background())
		return err == nil && len(ws) < 50
	})
	t.Logf("%d workers registered and went; %d connections closed before their reply (registration late) and registered again", n, resets.Load())
	if r := resets.Load(); r > int64(n)/1000 {
		t.Errorf("%d of %d registrations reset", r, n)
	}
}

// registerOnce registers worker id on a connection of its own, then closes it.
func registerOnce(addr net.Addr, id string) error {
	c, err := net.DialTimeout("tcp", addr.String(), waitFor)
	if err != nil {
		return err
	}
	defer c.Close()
	data, err := protocol.Encode(&protocol.WorkerRegister{WorkerID: id, Capacity: 1})
	if err != nil {
		return err
	}
	_ = c.SetDeadline(time.Now().Add(waitFor))
	if err := frame.Write(c, data); err != nil {
		return err
	}
	b, err := frame.NewReader(c).Read()
	if err != nil {
		return err
	}
	if want := fmt.Sprintf(`{"type":"WORKER_REGISTERED","workerId":%q}`, id); string(b) != want {
		return fmt.Errorf("got %s, want %s", b, want)
	}
	return nil
}

// neverReads pipelines LIST_JOBS on the client port and never reads a reply: the
// bridge drops the connection once a reply cannot be written in time.
func (s *system) neverReads(t *testing.T) {
	hog := dial(t, s.br.ClientAddr())
	batch := bytes.Repeat(framed(`{"type":"LIST_JOBS"}`), 1000)
	werr := make(chan error, 1)
	go func() {
		for {
			if err := hog.Write(batch); err != nil {
				werr <- err
				return
			}
		}
	}()
	select {
	case err := <-werr:
		if !isClosedErr(err) {
			t.Fatalf("hog write: %v", err)
		}
	case <-time.After(2 * waitFor):
		t.Fatal("a client that never reads was not dropped")
	}
	_ = hog.Close()
}

// usePeer is a peer on a connection the test dialled itself.
func usePeer(t *testing.T, c net.Conn) *peer {
	return specpeer.Use(t, c, specpeer.WithTimeout(waitFor))
}
