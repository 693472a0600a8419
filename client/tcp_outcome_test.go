package client_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// cutReplies is a TCP proxy to target that passes on a client's bytes and its
// server's until cut reports that the server's bytes (the last of them, and a few
// before) hold a reply; then it hangs up on both instead of passing that on: the
// request was served, and its caller never hears how. It returns the proxy's address.
func cutReplies(t *testing.T, target string, cut func(seen []byte) bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			wg.Go(func() {
				_, _ = io.Copy(out, in) // until either side hangs up
				_ = out.Close()
			})
			wg.Go(func() {
				defer in.Close()
				defer out.Close()
				var seen []byte // the last bytes passed on, and those just read
				buf := make([]byte, 64<<10)
				for {
					n, err := out.Read(buf)
					if err != nil {
						return
					}
					seen = append(seen, buf[:n]...)
					if cut(seen) {
						return
					}
					if _, err := in.Write(buf[:n]); err != nil {
						return
					}
					seen = seen[max(0, len(seen)-64):]
				}
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}

// anyReply cuts a client port's connection at its first reply.
func anyReply([]byte) bool { return true }

// TestTCPBrokenConnectionIsOutcomeUnknown: over DialTCP, a submission whose connection
// breaks after the bridge took it may be stored, and its error says so as the client's
// documentation promises, errors.Is(err, ErrOutcomeUnknown): here its job was stored.
// So for SubmitMany, each submission's result and the call's error; and for a request
// in flight at Close, whose error is ErrClosed as well.
func TestTCPBrokenConnectionIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s := jobbustest.Start(t)
	b := s.StartBridge(t, func(c *bridge.Config) { c.WorkerListen = "" })
	native := client.New(s.NC)
	stored := func(t *testing.T, n int) {
		t.Helper()
		list, err := native.List(context.Background(), protocol.ListJobs{})
		if err != nil || len(list.Jobs) != n {
			t.Fatalf("jobs stored: %+v, %v; want %d", list.Jobs, err, n)
		}
	}

	t.Run("Submit", func(t *testing.T) {
		c := dial(t, cutReplies(t, b.ClientAddr().String(), anyReply))
		_, err := c.Submit(context.Background(), "SHA256", map[string]string{"text": "cut"})
		stored(t, 1)
		if !errors.Is(err, client.ErrOutcomeUnknown) {
			t.Fatalf("Submit whose reply was cut off after its job was stored = %v; want an error matching ErrOutcomeUnknown", err)
		}
	})
	t.Run("SubmitMany", func(t *testing.T) {
		c := dial(t, cutReplies(t, b.ClientAddr().String(), anyReply))
		res, err := c.SubmitMany(context.Background(), []client.Submission{
			{TaskType: "SHA256", Payload: map[string]string{"text": "cut 1"}},
			{TaskType: "SHA256", Payload: map[string]string{"text": "cut 2"}},
		})
		stored(t, 3)
		if !errors.Is(err, client.ErrOutcomeUnknown) {
			t.Errorf("SubmitMany whose reply was cut off = %v; want an error matching ErrOutcomeUnknown", err)
		}
		for i, r := range res {
			if !errors.Is(r.Err, client.ErrOutcomeUnknown) {
				t.Errorf("submission %d whose reply was cut off = %q, %v; want an error matching ErrOutcomeUnknown", i, r.JobID, r.Err)
			}
		}
	})
	t.Run("Close", func(t *testing.T) {
		p := newFramePeer(t)
		c := dial(t, p.addr())
		conn := p.accept()
		done := make(chan error, 1)
		go func() {
			_, err := c.Submit(context.Background(), "SHA256", map[string]string{"text": "closed"})
			done <- err
		}()
		conn.read(1) // the bridge has it
		_ = c.Close()
		if err := <-done; !errors.Is(err, client.ErrOutcomeUnknown) || !errors.Is(err, client.ErrClosed) {
			t.Fatalf("Submit in flight at Close = %v; want an error matching ErrOutcomeUnknown and ErrClosed", err)
		}
	})
}

// TestTCPUnansweredSubmissionNamesItsJob: over DialTCP with the defaults on both
// sides, a submission the coordinator takes and never answers is answered by the
// bridge at its request timeout, "Outcome unknown" naming the job, and the client
// hears that answer. The client used to give up at the same 5 s, first, with its
// context's error and no job to ask about; over NATS the same submission names it.
func TestTCPUnansweredSubmissionNamesItsJob(t *testing.T) {
	t.Parallel()
	s := jobbustest.Start(t, jobbustest.WithoutCoordinator())
	e, _ := protocol.EndpointFor(protocol.TypeSubmitJob)
	overhear(t, s.NC, e.Subject(), nil) // a coordinator that takes submissions and never answers
	b := s.StartBridge(t, func(c *bridge.Config) { c.WorkerListen = "" })
	c := dial(t, b.ClientAddr().String())
	_, err := c.Submit(context.Background(), "SHA256", map[string]string{"text": "unanswered"})
	if id, named := client.OutcomeJob(err); !errors.Is(err, client.ErrOutcomeUnknown) || !named || id == "" {
		t.Fatalf("Submit the coordinator never answered = %v; want the bridge's Outcome unknown naming its job", err)
	}
}
