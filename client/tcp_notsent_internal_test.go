package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// stalledPeer is a client port that accepts one connection, with a small receive
// buffer, and reads nothing from it (a bridge frozen) until drained: then it reads
// what arrived, to the EOF of the client's close, and returns the frames that arrived
// whole.
type stalledPeer struct {
	addr  string
	drain chan struct{}
	got   chan [][]byte
}

func newStalledPeer(t *testing.T) *stalledPeer {
	t.Helper()
	ln := listenSmallReceives(t)
	p := &stalledPeer{addr: ln.Addr().String(), drain: make(chan struct{}), got: make(chan [][]byte, 1)}
	var wg sync.WaitGroup
	wg.Go(func() {
		nc, err := ln.Accept()
		if err != nil {
			p.got <- nil
			return
		}
		defer nc.Close()
		<-p.drain
		_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		data, _ := io.ReadAll(nc)
		var frames [][]byte
		for len(data) >= 4 {
			n := int(binary.BigEndian.Uint32(data))
			if len(data) < 4+n {
				break // arrived in part
			}
			frames = append(frames, data[4:4+n])
			data = data[4+n:]
		}
		p.got <- frames
	})
	t.Cleanup(func() {
		_ = ln.Close()
		select {
		case <-p.drain:
		default:
			close(p.drain)
		}
		wg.Wait()
	})
	return p
}

// received is what arrived whole, once the client closed its connection.
func (p *stalledPeer) received() [][]byte {
	close(p.drain)
	return <-p.got
}

// dialStalled is a DialTCP client of p whose send buffer is what a network path starts
// with (on loopback the kernel would take megabytes at once), and whose writes stall
// for at most stall.
func dialStalled(t *testing.T, p *stalledPeer, stall time.Duration) (*Client, *tcpConn) {
	t.Helper()
	c, err := DialTCP(context.Background(), p.addr, WithTimeout(stall))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	conn, _ := c.tr.(*tcpTransport).installed()
	if err := conn.nc.(*net.TCPConn).SetWriteBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	return c, conn
}

// TestTCPFlusherWriteFailureSaysNotSentOfFramesNeverWritten: over DialTCP, when the
// bridge stops reading and the write of several requests' frames queued together
// fails, the requests whose frames were written whole may have been acted on (outcome
// unknown), but those whose frames were not (the bridge acts on whole frames only)
// cannot have been: their errors say "not sent" and do not match ErrOutcomeUnknown.
// Every one of them said outcome unknown.
//
// (Which frames were written whole is read back from what the stalled bridge received
// once the client closed: the kernel sends what it took before the close.)
func TestTCPFlusherWriteFailureSaysNotSentOfFramesNeverWritten(t *testing.T) {
	t.Parallel()
	p := newStalledPeer(t)
	c, conn := dialStalled(t, p, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // past the write's stall
	defer cancel()

	// The first, small and alone, is written at once; the others, queued while it is
	// in flight, go out together in the flusher's write, which stalls and fails.
	const n = 8
	errs := make([]error, n+1)
	first := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		close(first)
		_, errs[0] = c.Submit(ctx, "SHA256", map[string]string{"text": "req-00"})
	})
	<-first
	queued := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			conn.mu.Lock()
			inFlight, err := conn.n, conn.err
			conn.mu.Unlock()
			switch {
			case inFlight == n:
				return
			case err != nil || time.Now().After(deadline):
				t.Fatalf("%d requests queued on the connection (%v); want %d (the test's premise)", inFlight, err, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	queued(1)
	// Frames of 48 KiB: the kernel takes a few of them whole (its send buffer is
	// twice the 64 KiB asked for), then part of one, then nothing.
	big := strings.Repeat("x", 48<<10)
	for i := 1; i <= n; i++ {
		wg.Go(func() {
			_, errs[i] = c.Submit(ctx, "SHA256", map[string]string{"text": fmt.Sprintf("req-%02d", i) + big})
		})
	}
	queued(n + 1) // all on this connection, before its write fails (a second later)
	wg.Wait()
	_ = c.Close()

	whole := make(map[int]bool)
	for _, f := range p.received() {
		for i := 0; i <= n; i++ {
			if strings.Contains(string(f[:min(len(f), 256)]), fmt.Sprintf(`"req-%02d`, i)) {
				whole[i] = true
			}
		}
	}
	if !whole[0] || len(whole) < 2 || len(whole) > n {
		t.Fatalf("frames that arrived whole: %v; want the first, some of those written together, not all (the test's premise)", whole)
	}
	for i, err := range errs {
		switch {
		case err == nil:
			t.Errorf("request %d succeeded; want it to fail", i)
		case whole[i] && !errors.Is(err, ErrOutcomeUnknown):
			t.Errorf("request %d, whose frame was written whole = %v; want an error matching ErrOutcomeUnknown", i, err)
		case !whole[i] && (errors.Is(err, ErrOutcomeUnknown) || !strings.Contains(err.Error(), "not sent")):
			t.Errorf("request %d, whose frame was not written whole = %v; want it to say not sent, not outcome unknown", i, err)
		}
	}
}

// TestTCPCloseDuringAStalledWriteSaysNotSent: over DialTCP, a client closed while a
// request's lone frame is stalled in its write (the bridge stopped reading) has not
// written that frame whole, so the bridge cannot have acted on it: the request's error
// is ErrClosed and says "not sent", not outcome unknown. It said outcome unknown.
func TestTCPCloseDuringAStalledWriteSaysNotSent(t *testing.T) {
	t.Parallel()
	p := newStalledPeer(t)
	c, conn := dialStalled(t, p, 30*time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := c.Submit(context.Background(), "SHA256", map[string]string{"text": strings.Repeat("x", protocol.MaxMessage-1024)})
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		conn.mu.Lock()
		writing := conn.writing
		conn.mu.Unlock()
		if writing {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the request's write never began")
		}
		time.Sleep(time.Millisecond)
	}
	_ = c.Close()
	err := <-done
	if got := p.received(); len(got) != 0 {
		t.Fatalf("%d frames arrived whole; want none (the test's premise)", len(got))
	}
	if !errors.Is(err, ErrClosed) || errors.Is(err, ErrOutcomeUnknown) || !strings.Contains(err.Error(), "not sent") {
		t.Fatalf("Submit closed during its stalled write = %v; want ErrClosed, saying not sent, not outcome unknown", err)
	}
}
