package bridge

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"time"

	"github.com/jobbus/jobbus/internal/backoff"
)

// port is one listening port and its session function.
type port struct {
	name string // "worker" or "client": the log's port key
	ln   net.Listener
	// serve runs a session on a connection; it calls release once the connection is
	// closed, which frees its slot (a worker session may outlive its connection while
	// a result is still being delivered).
	serve func(c net.Conn, release func())
	// settles says Close waits for the port's sessions (Bridge.settling): a worker
	// session holds the results it read until the coordinator answers them.
	settles bool
	// open counts the port's connections; guarded by Bridge.mu.
	open int
}

// acceptRetry is the backoff after a failed accept.
var acceptRetry = backoff.Policy{Base: 5 * time.Millisecond, Max: time.Second}

// accept accepts connections until the listener closes.
func (b *Bridge) accept(p *port) {
	defer b.wg.Done()
	retry := acceptRetry.Start()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if b.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off instead of spinning.
			delay := retry.Next()
			b.log.Warn("accept failed", "port", p.name, "err", err, "retry_in", delay)
			if !backoff.Sleep(b.ctx, delay) {
				return
			}
			continue
		}
		retry.Reset()
		b.admit(p, c)
	}
}

// admit starts a session on c, or refuses c when the port is at its limit.
func (b *Bridge) admit(p *port, c net.Conn) {
	b.stats.accepted[portIndex(p.name)].Add(1)
	b.mu.Lock()
	switch {
	case b.closed:
		b.mu.Unlock()
		_ = c.Close()
		return
	case p.open >= b.cfg.MaxConns:
		b.mu.Unlock()
		b.refuse(p, c)
		return
	}
	p.open++
	b.conns[c] = struct{}{}
	b.wg.Add(1)
	if p.settles {
		b.settling.Add(1) // under mu, while not closed: never after Close began to wait
	}
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		if p.settles {
			defer b.settling.Done()
		}
		released := false
		release := func() {
			if !released {
				released = true
				_ = c.Close()
				b.forget(p, c)
			}
		}
		defer release()
		if !b.handshake(p, c) {
			return
		}
		p.serve(c, release)
	}()
}

func (b *Bridge) forget(p *port, c net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.conns[c]; ok {
		delete(b.conns, c)
		p.open--
	}
}

// refuse answers a connection beyond the limit with a best-effort ERROR and closes it.
// It runs on the accept loop, so the write gets a short deadline: a fresh socket's
// buffer takes a small frame at once.
func (b *Bridge) refuse(p *port, c net.Conn) {
	b.stats.refused[portIndex(p.name)].Add(1)
	b.log.Warn("connection refused: too many connections", "port", p.name, "remote", c.RemoteAddr().String(), "limit", b.cfg.MaxConns)
	_ = writeFrame(c, encodeError(errTooManyConns(b.cfg.MaxConns)), min(b.cfg.WriteTimeout, 100*time.Millisecond))
	_ = c.Close()
}

// handshake completes a TLS connection's handshake within the frame-stall timeout, so
// that a peer that never finishes it holds its slot no longer than a stalled frame.
// It reports whether the session may go on; a plain connection always may.
func (b *Bridge) handshake(p *port, c net.Conn) bool {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return true
	}
	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.FrameStallTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		b.log.Info("TLS handshake failed; closing", "port", p.name, "remote", c.RemoteAddr().String(), "err", err)
		return false
	}
	return true
}
