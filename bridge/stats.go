package bridge

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol/frame"
)

// Frame error reasons, as Stats counts them.
const (
	FrameBadLength = "bad_length" // a length prefix of zero or beyond the limit
	FrameStalled   = "stalled"    // a frame that began did not complete in time
	FrameMalformed = "malformed"  // a complete frame that is not a valid message
)

var frameReasons = [...]string{FrameBadLength, FrameStalled, FrameMalformed}

// PortStats is what one port of a bridge has seen.
type PortStats struct {
	Open        int               // connections open now
	Accepted    uint64            // connections accepted since start, refused ones included
	Refused     uint64            // connections refused at the limit
	FrameErrors map[string]uint64 // by reason: FrameBadLength, FrameStalled, FrameMalformed
}

// Stats is a snapshot of a bridge's counters, for metrics.
type Stats struct {
	Ports map[string]PortStats // by port: "worker", "client", "mu"
	// Bus sums the bus nodes of the TCP workers' and Mu nodes' sessions, live and ended.
	Bus bus.Stats
	// Results counts the TCP workers' results by how their delivery ended. A result
	// travels in a batch with others (task.results) when the coordinator takes them,
	// so the bus's asks do not count results.
	Results ResultStats
}

// ResultStats counts the TCP workers' results whose delivery has ended.
type ResultStats struct {
	Answered  uint64 // the coordinator answered it: applied, or stale (changing nothing)
	Refused   uint64 // the coordinator refused it (400, or 403: another worker's attempt)
	Abandoned uint64 // not answered within ResultRetryFor, or within ShutdownTimeout of Close
}

// counters are the bridge's own counts; the ports' open connections are counted in
// port.open under Bridge.mu.
type counters struct {
	accepted, refused [3]atomic.Uint64 // worker, client, mu
	frameErrs         [3][len(frameReasons)]atomic.Uint64
	results           [3]atomic.Uint64 // answered, refused, abandoned

	mu      sync.Mutex
	nodes   map[*bus.Node]struct{} // the bus nodes of sessions, until closed
	retired bus.Stats              // the last counts of closed ones
}

func portIndex(name string) int {
	switch name {
	case "client":
		return 1
	case "mu":
		return 2
	}
	return 0
}

// frameError counts the error that ended a connection's reading, if it is the peer's
// fault.
func (c *counters) frameError(port string, err error) {
	reason := -1
	switch {
	case errors.Is(err, frame.ErrBadLength), errors.Is(err, frame.ErrTooLarge):
		reason = 0
	case errors.Is(err, errStalled):
		reason = 1
	}
	if reason >= 0 {
		c.frameErrs[portIndex(port)][reason].Add(1)
	}
}

func (c *counters) malformed(port string) { c.frameErrs[portIndex(port)][2].Add(1) }

// result counts a result whose delivery ended with err.
func (c *counters) result(err error) {
	switch {
	case err == nil:
		c.results[0].Add(1)
	case errors.Is(err, bus.CodeBadRequest), errors.Is(err, bus.CodeForbidden):
		c.results[1].Add(1)
	default:
		c.results[2].Add(1)
	}
}

// track counts a session's bus node from now on.
func (c *counters) track(n *bus.Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nodes == nil {
		c.nodes = make(map[*bus.Node]struct{})
	}
	c.nodes[n] = struct{}{}
}

// retire closes a session's bus node and keeps its last counts.
func (c *counters) retire(n *bus.Node) {
	_ = n.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.nodes[n]; ok {
		delete(c.nodes, n)
		c.retired.Add(n.Stats())
	}
}

func (c *counters) busStats() bus.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	var s bus.Stats
	s.Add(c.retired)
	for n := range c.nodes {
		s.Add(n.Stats())
	}
	return s
}

// Stats returns a snapshot of the bridge's counters.
func (b *Bridge) Stats() Stats {
	s := Stats{Ports: make(map[string]PortStats, 3)}
	b.mu.Lock()
	open := map[string]int{}
	for _, p := range b.ports {
		open[p.name] = p.open
	}
	b.mu.Unlock()
	for i, name := range []string{"worker", "client", "mu"} {
		ps := PortStats{Open: open[name], Accepted: b.stats.accepted[i].Load(), Refused: b.stats.refused[i].Load(),
			FrameErrors: make(map[string]uint64, len(frameReasons))}
		for r, reason := range frameReasons {
			ps.FrameErrors[reason] = b.stats.frameErrs[i][r].Load()
		}
		s.Ports[name] = ps
	}
	s.Bus = b.stats.busStats()
	s.Results = ResultStats{Answered: b.stats.results[0].Load(), Refused: b.stats.results[1].Load(), Abandoned: b.stats.results[2].Load()}
	return s
}
