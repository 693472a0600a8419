package coordinator

import (
	"encoding/json"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/natsurl"
	"github.com/jobbus/jobbus/internal/version"
)

// presence answers `jobbus cluster` for one coordinator process: who it is, whether
// it leads or stands by, and since when. It answers protocol.CoordinatorsSubject without
// a queue group, so every coordinator answers; it writes nothing to KV.
type presence struct {
	nc  *nats.Conn
	sub *nats.Subscription

	mu   sync.Mutex
	self protocol.Coordinator
}

// startPresence answers for coordinator id on nc until close; a failure to subscribe
// costs only the presence, so it is logged and not returned.
func startPresence(nc *nats.Conn, id string, log *slog.Logger) *presence {
	host, _ := os.Hostname()
	now := time.Now().UnixMilli()
	p := &presence{nc: nc, self: protocol.Coordinator{
		ID: id, State: protocol.CoordinatorStandby, Since: now, Started: now,
		Host: host, PID: os.Getpid(), Version: version.String(),
	}}
	sub, err := nc.Subscribe(protocol.CoordinatorsSubject, p.answer)
	if err != nil {
		log.Warn("coordinator presence off: jobbus cluster will not list this coordinator", "err", err)
		return p
	}
	p.sub = sub
	return p
}

func (p *presence) answer(m *nats.Msg) {
	p.mu.Lock()
	self := p.self
	p.mu.Unlock()
	self.Server = p.nc.ConnectedServerName()
	if self.Server == "" {
		self.Server = natsurl.Connected(p.nc)
	}
	data, err := json.Marshal(self)
	if err == nil {
		_ = m.Respond(data)
	}
}

// set records a change of state (protocol.CoordinatorLeading or CoordinatorStandby).
func (p *presence) set(state string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.self.State != state {
		p.self.State, p.self.Since = state, time.Now().UnixMilli()
	}
}

func (p *presence) close() {
	if p.sub != nil {
		_ = p.sub.Unsubscribe()
	}
}
