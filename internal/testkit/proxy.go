package testkit

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy on a loopback port to one address, whose traffic a test can
// cut: Cut closes every connection through it and refuses new ones (accepted, then
// closed at once, as a peer whose network is down sees it) until Restore. It stops
// when the test ends. Delay slows what its clients send, as a long network path does.
type Proxy struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // nanoseconds each chunk from a client waits; 0 none

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewProxy proxies a loopback port to target (host:port).
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testkit: proxy listen: %v", err)
	}
	p := &Proxy{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every connection through the proxy and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Delay holds every chunk a client sends for d before passing it on to the target, in
// order (only its latency, not its throughput, changes); 0 passes them at once. What a
// client sent just before it closed still arrives, d later, before the target's
// connection closes. It applies to the chunks read from now on.
func (p *Proxy) Delay(d time.Duration) { p.delay.Store(int64(d)) }

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		p.wg.Add(1)
		go p.serve(in)
	}
}

// serve pipes in to a new connection to the target until either side ends.
func (p *Proxy) serve(in net.Conn) {
	defer p.wg.Done()
	defer in.Close()
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer out.Close()
	if !p.track(in, out) {
		return
	}
	defer p.untrack(in, out)
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(out, delayed{in, p})
		// Either direction ending ends both, as a cut network does.
		_ = out.Close()
		_ = in.Close()
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(in, out)
		_ = in.Close()
		// Delayed, what the client sent before it closed is still on its way: the
		// client's end must not cut it off (the other direction closes out once through).
		if p.delay.Load() == 0 {
			_ = out.Close()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}

// track registers a connection pair, or reports false while the proxy is cut.
func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// delayed reads a client's connection, each chunk once the proxy's delay has passed
// since it was read: a goroutine reads ahead, so that chunks in a row are each delayed
// once, not one after the other.
type delayed struct {
	c net.Conn
	p *Proxy
}

func (d delayed) WriteTo(w io.Writer) (int64, error) {
	type chunk struct {
		data []byte
		at   time.Time
		err  error
	}
	chunks := make(chan chunk, 1024)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := d.c.Read(buf)
			chunks <- chunk{buf[:n], time.Now().Add(time.Duration(d.p.delay.Load())), err}
			if err != nil {
				return
			}
		}
	}()
	// Returning early, the reader is left to end once its connection closes: it must
	// not wait for room in chunks meanwhile.
	defer func() {
		go func() {
			for range chunks {
			}
		}()
	}()
	var total int64
	for c := range chunks {
		time.Sleep(time.Until(c.at)) // the network's latency, not a synchronisation
		n, err := w.Write(c.data)
		total += int64(n)
		switch {
		case err != nil:
			return total, err
		case errors.Is(c.err, io.EOF):
			return total, nil
		case c.err != nil:
			return total, c.err
		}
	}
	return total, nil
}

func (d delayed) Read([]byte) (int, error) { return 0, errors.New("testkit: read through WriteTo") }
