package bridge_test

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
	"github.com/jobbus/jobbus/coordinator"
)

// FuzzSession feeds arbitrary bytes to a client-port and a worker-port session of a
// real bridge in front of a real coordinator, then half-closes: whatever the input,
// every frame the bridge writes is a well-formed message the port may send, and the
// session ends instead of hanging.
func FuzzSession(f *testing.F) {
	s := setup(f, withCoordinator(func(c *coordinator.Config) { c.MaxActiveJobs = 1 << 20 }),
		withBridge(func(c *bridgeConfig) { c.FrameStallTimeout = 100 * time.Millisecond }))
	for _, seed := range [][]byte{
		framed(`{"type":"LIST_WORKERS"}`),
		append(framed(`{"type":"GET_JOB_STATUS","jobId":"x"}`), framed(`{"type":"LIST_JOBS"}`)...),
		framed(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"a"},"maxAttempts":1}`),
		// Submissions sent ahead of their replies, forwarded together (ahead.go).
		append(append(framed(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"a"},"maxAttempts":1}`),
			framed(`{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"durationMillis":-1},"maxAttempts":1}`)...),
			framed(`{"type":"SUBMIT_JOB","taskType":"WORD_COUNT","payload":{"text":"a b"},"maxAttempts":1}`)...),
		append(append(framed(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"a"},"maxAttempts":1}`),
			framed(`{"type":"SUBMIT_JOB","taskType":"SHA256","maxAttempts":"x"}`)...),
			framed(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"b"},"maxAttempts":1}`)...),
		framed(`{"type":"WORKER_REGISTER","workerId":"fuzz","capacity":2}`),
		append(framed(`{"type":"WORKER_REGISTER","workerId":"fuzz","capacity":2}`), framed(`{"type":"HEARTBEAT","workerId":"fuzz"}`)...),
		framed(`{"type":"HEARTBEAT","workerId":"w"}`),
		framed(`nope`),
		header(0),
		header(1<<31 - 1),
		append(header(10), 'x'),
	} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	f.Fuzz(func(t *testing.T, input []byte, workerPort bool) {
		addr, legal := s.br.ClientAddr(), clientReplies
		if workerPort {
			addr, legal = s.br.WorkerAddr(), workerFrames
		}
		c, err := net.Dial("tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		written := make(chan struct{})
		defer func() {
			_ = c.Close()
			<-written
		}()
		go func() {
			defer close(written)
			_ = c.SetWriteDeadline(time.Now().Add(waitFor))
			_, _ = c.Write(input)
			_ = c.(*net.TCPConn).CloseWrite()
		}()
		r := frame.NewReader(c)
		_ = c.SetReadDeadline(time.Now().Add(waitFor))
		for {
			b, err := r.Read()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("session still open %v after the input ended", waitFor)
			}
			if err != nil {
				return // closed, as it must be once the input ends
			}
			m, err := protocol.Decode(b)
			if err != nil {
				t.Fatalf("bridge wrote a malformed frame %q: %v", b, err)
			}
			if !legal[m.MessageType()] {
				t.Fatalf("bridge wrote %s on this port", m.MessageType())
			}
		}
	})
}

var clientReplies = map[protocol.Type]bool{
	protocol.TypeError: true, protocol.TypeJobSubmitted: true, protocol.TypeSubmitRejected: true,
	protocol.TypeJobStatus: true, protocol.TypeJobList: true, protocol.TypeWorkerList: true, protocol.TypeJobCancel: true,
}

var workerFrames = map[protocol.Type]bool{
	protocol.TypeError: true, protocol.TypeWorkerRegistered: true, protocol.TypeTaskAssign: true, protocol.TypeTaskCancel: true,
}
