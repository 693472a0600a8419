package bridge_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/testkit/specpeer"
)

// attack is what a hostile peer sends and what it must get: the close, after a
// best-effort ERROR starting with wantError when that is not empty.
type attack struct {
	name      string
	bytes     []byte
	wantError string
}

func framed(payload string) []byte { return append(header(uint32(len(payload))), payload...) }

func attacks(port string) []attack {
	rng := rand.New(rand.NewPCG(7, 7))
	random := make([]byte, 64<<10)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	wrongTypes := `{"type":"GET_JOB_STATUS","jobId":5}`
	if port == "worker" {
		wrongTypes = `{"type":"WORKER_REGISTER","workerId":"w","capacity":"4"}`
	}
	var silence []attack
	if port == "worker" {
		silence = append(silence, attack{"Silence", nil, ""}) // a registration is due at once
	}
	return append(silence,
		attack{"RandomBytes", random, ""}, // a random length: ERROR, or a stalled frame
		attack{"MaxInt32Length", append(header(1<<31-1), "{}"...), "Malformed request: frame: payload too large"},
		attack{"ZeroLength", header(0), "Malformed request: frame: length must be positive"},
		attack{"NegativeLength", header(0xFFFFFFFF), "Malformed request: frame: length must be positive"},
		attack{"JustOverMax", header(1<<20 + 1), "Malformed request: frame: payload too large"},
		attack{"NonJSON", framed("\x00\x01binary"), "Malformed request: "},
		attack{"UnknownType", framed(`{"type":"EXPLODE"}`), "Malformed request: "},
		attack{"WrongFieldTypes", framed(wrongTypes), "Malformed request: "},
		attack{"HalfFrame", append(header(100), `{"type":"LIST`...), ""},
	)
}

// TestMalformedProtocol throws every attack at both ports, all at once, while a healthy
// spec worker keeps completing jobs submitted through the client port.
func TestMalformedProtocol(t *testing.T) {
	t.Parallel()
	s := setup(t, withBridge(func(c *bridgeConfig) { c.FrameStallTimeout = 200 * time.Millisecond }))
	s.specWorker("healthy", 4)
	s.healthy(3)

	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // load during the attacks
		defer wg.Done()
		c, err := net.Dial("tcp", s.br.ClientAddr().String())
		if err != nil {
			return
		}
		defer c.Close()
		p := specpeer.Use(t, c, specpeer.WithTimeout(waitFor))
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			if err := p.Send(&protocol.SubmitJob{TaskType: "SHA256", Payload: []byte(fmt.Sprintf(`{"text":"during %d"}`, i))}); err != nil {
				t.Errorf("submit during attacks: %v", err)
				return
			}
			if m, err := p.Recv(); err != nil || m.MessageType() != protocol.TypeJobSubmitted {
				t.Errorf("submit during attacks: %v %v", m, err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()

	t.Run("attacks", func(t *testing.T) {
		for _, port := range []string{"client", "worker"} {
			addr := s.br.ClientAddr()
			if port == "worker" {
				addr = s.br.WorkerAddr()
			}
			for _, a := range attacks(port) {
				t.Run(port+"/"+a.name, func(t *testing.T) {
					t.Parallel()
					p := dial(t, addr)
					_ = p.Write(a.bytes) // the bridge may close before taking it all
					if a.wantError == "" {
						p.ExpectClosed()
						return
					}
					p.ExpectErrorThenClosed(a.wantError)
				})
			}
			// The same, after a valid registration.
			if port == "worker" {
				for _, a := range attacks(port) {
					if a.bytes == nil {
						continue // silence after registration is legal: heartbeats are the coordinator's business
					}
					t.Run("registered/"+a.name, func(t *testing.T) {
						t.Parallel()
						id := "victim-" + a.name
						p := s.worker(id, 1)
						_ = p.Write(a.bytes)
						frames := p.ExpectClosed()
						if a.wantError != "" && (len(frames) != 1 || !strings.HasPrefix(string(frames[0]), `{"type":"ERROR","message":"Malformed request: `)) {
							t.Fatalf("frames before the close: %q", frames)
						}
						eventually(t, "attacker lost", func() bool { return !s.hasWorker(id) })
					})
				}
			}
		}
		t.Run("Slowloris", func(t *testing.T) {
			t.Parallel()
			for _, addr := range []net.Addr{s.br.ClientAddr(), s.br.WorkerAddr()} {
				p := dial(t, addr)
				// A 4 KiB frame trickled a byte every 20 ms would take 80 s: the stall
				// timeout (200 ms) must end it long before.
				if err := p.Write(header(4096)); err != nil {
					t.Fatal(err)
				}
				closed := make(chan error, 1)
				go func() {
					for range 4096 {
						if err := p.Write([]byte{' '}); err != nil {
							closed <- err
							return
						}
						time.Sleep(20 * time.Millisecond)
					}
					closed <- nil
				}()
				p.ExpectClosed()
				_ = p.Close()
				if err := <-closed; err == nil {
					t.Fatal("the whole frame was accepted at a trickle")
				}
			}
		})
	})
	close(done)
	wg.Wait()
	s.healthy(5)
	if !s.hasWorker("healthy") {
		t.Fatal("the healthy worker was lost")
	}
}

// TestPeerThatNeverReads: a worker that registers a large capacity and never reads is
// dropped once its socket and its queue fill, and the jobs it held complete on the
// healthy worker. The heartbeat timeout is an hour: only the drop explains the loss.
func TestPeerThatNeverReads(t *testing.T) {
	t.Parallel()
	s := setup(t, withBridge(func(c *bridgeConfig) {
		c.WriteTimeout = 300 * time.Millisecond
		c.WriteQueue = 16
	}))
	sink := dial(t, s.br.WorkerAddr())
	if err := sink.Conn().(*net.TCPConn).SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	sink.Register("sink", 1024) // most free slots: it gets the jobs first
	s.specWorker("healthy", 8)
	text := strings.Repeat("word ", 30000) // 150 kB per TASK_ASSIGN
	payload, _ := json.Marshal(map[string]string{"text": text})
	ids := make([]string, 60) // 9 MB: more than the socket buffers hold
	for i := range ids {
		var err error
		if ids[i], err = s.native.Submit(context.Background(), "WORD_COUNT", json.RawMessage(payload)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "sink dropped", func() bool { return !s.hasWorker("sink") })
	for _, id := range ids {
		s.waitState(id, protocol.StateCompleted)
	}
	lost := 0
	for _, id := range ids {
		if j := s.job(id); j.Error != nil && *j.Error == "worker sink lost (connection closed)" {
			lost++
		}
	}
	if lost == 0 {
		t.Fatal("no job was ever assigned to the sink")
	}
	t.Logf("%d of %d jobs failed over from the sink", lost, len(ids))
	_ = sink.Close()
}

// TestClientThatNeverReads pipelines requests whose replies it never reads: the bridge
// drops it when a reply cannot be written in time, and serves everyone else meanwhile.
func TestClientThatNeverReads(t *testing.T) {
	t.Parallel()
	s := setup(t, withBridge(func(c *bridgeConfig) { c.WriteTimeout = 300 * time.Millisecond }))
	s.specWorker("healthy", 4)
	for i := range 300 {
		if _, err := s.native.Submit(context.Background(), "SLEEP", map[string]int{"durationMillis": i}, func(sj *protocol.SubmitJob) { sj.MaxAttempts = 1 }); err != nil {
			t.Fatal(err)
		}
	}
	hog := s.client()
	req := framed(`{"type":"LIST_JOBS"}`)
	batch := bytes.Repeat(req, 1000)
	werr := make(chan error, 1)
	go func() {
		for {
			if err := hog.Write(batch); err != nil {
				werr <- err
				return
			}
		}
	}()
	s.healthy(3) // served while the hog is stuck
	select {
	case err := <-werr:
		if !isClosedErr(err) {
			t.Fatalf("hog write: %v", err)
		}
	case <-time.After(waitFor):
		t.Fatal("a client that never reads was not dropped")
	}
	_ = hog.Close()
	s.healthy(2)
}

func TestConnectionLimit(t *testing.T) {
	t.Parallel()
	s := setup(t, withBridge(func(c *bridgeConfig) { c.MaxConns = 3 }))
	s.specWorker("healthy", 1) // one of the worker port's three
	for _, port := range []string{"client", "worker"} {
		t.Run(port, func(t *testing.T) {
			addr, free := s.br.ClientAddr(), 3
			use := func(p *peer, i int) {
				if _, ok := p.Request(&protocol.ListWorkers{}).(*protocol.WorkerList); !ok {
					t.Fatal("request failed")
				}
			}
			if port == "worker" {
				addr, free = s.br.WorkerAddr(), 2
				use = func(p *peer, i int) { p.Register(fmt.Sprintf("limited-%d", i), 1) }
			}
			var open []*peer
			for i := range free {
				p := dial(t, addr)
				use(p, i) // admitted: the session answers
				open = append(open, p)
			}
			extra := dial(t, addr)
			extra.ExpectErrorThenClosed("too many connections (limit 3)")
			_ = open[0].Close()
			eventually(t, "a slot freed", func() bool {
				p := dial(t, addr)
				defer p.Close()
				if port == "worker" {
					_ = p.Send(&protocol.WorkerRegister{WorkerID: "limited-again", Capacity: 1})
				} else {
					_ = p.Send(&protocol.ListWorkers{})
				}
				m, err := p.Recv()
				return err == nil && m.MessageType() != protocol.TypeError
			})
			for _, p := range open[1:] {
				_ = p.Close()
			}
		})
	}
	s.healthy(2)
}

func TestPortInUse(t *testing.T) {
	t.Parallel()
	s := setup(t)
	cfg := fastBridge()
	cfg.WorkerListen = s.br.WorkerAddr().String()
	cfg.ClientListen = "127.0.0.1:0"
	br, err := bridge.New(s.NC, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	err = br.Start(context.Background())
	want := fmt.Sprintf("bridge: listen %s: port in use (pass --worker-port)", cfg.WorkerListen)
	if err == nil || err.Error() != want || !errors.Is(err, bridge.ErrPortInUse) {
		t.Fatalf("Start: %v, want %q", err, want)
	}
	if br.ClientAddr() != nil {
		t.Fatal("a failed Start left the client port listening")
	}
}

// TestSeveralBridgesOneCoordinator: two bridges serve one coordinator; a worker on one
// runs a job submitted on the other.
func TestSeveralBridgesOneCoordinator(t *testing.T) {
	t.Parallel()
	s := setup(t)
	other := startBridge(t, s.NC, fastBridge())
	w := dial(t, other.WorkerAddr())
	w.Register("elsewhere", 1)
	id := s.client().Submit("SHA256", `{"text":"x"}`)
	a := w.ExpectAssign(id)
	w.MustSend(&protocol.TaskResult{WorkerID: "elsewhere", JobID: id, AttemptID: a.AttemptID, Success: true, Result: ptr("r")})
	s.waitState(id, protocol.StateCompleted)
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "worker lost with its bridge", func() bool { return !s.hasWorker("elsewhere") })
}
