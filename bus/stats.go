package bus

import (
	"sync/atomic"
	"time"
)

// Stats is a snapshot of a node's counters, all counted since the node was created.
type Stats struct {
	Sent     KindCounts // messages published, by kind
	Received KindCounts // messages received (handlers, answers, presence), by kind

	BytesSent     uint64 // payload bytes published
	BytesReceived uint64 // payload bytes received

	Asks AskCounts // asks by outcome
	// AskLatency counts answered asks (OK and RemoteError) by round-trip time: each bucket
	// holds the asks slower than the previous bound and at most UpTo; the last bucket has
	// UpTo 0 and holds the rest.
	AskLatency []LatencyBucket
	// AskLatencySum is the total round-trip time of the asks in AskLatency.
	AskLatencySum time.Duration

	Reconnects  uint64 // connection came back after being lost
	Disconnects uint64 // connection lost

	HandlerErrors uint64 // handlers that returned an error
	HandlerPanics uint64 // handlers that panicked
	Dropped       uint64 // messages not handled: malformed envelope, unexpected kind, node closing
	InFlight      int    // handlers running at the time of the snapshot
}

// KindCounts counts messages by kind.
type KindCounts struct {
	Tell, Ask, Response, Error, Heartbeat uint64
}

// AskCounts counts asks by outcome.
type AskCounts struct {
	OK           uint64 // answered with RESPONSE
	RemoteError  uint64 // answered with ERROR
	Timeout      uint64 // ErrTimeout
	NoPeer       uint64 // ErrNoPeer
	Disconnected uint64 // ErrDisconnected
	Failed       uint64 // anything else: closed node, the node asked left (presence), bad address, encoding
}

// LatencyBucket is one bucket of a latency histogram.
type LatencyBucket struct {
	UpTo  time.Duration // upper bound, inclusive; 0 for the last, unbounded bucket
	Count uint64
}

// askLatencyBounds are the histogram's fixed upper bounds. Read-only.
var askLatencyBounds = [...]time.Duration{
	50 * time.Microsecond, 100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second,
}

const numKinds = 5

type askOutcome int

const (
	askOK askOutcome = iota
	askRemoteError
	askTimeout
	askNoPeer
	askDisconnected
	askFailed
	numOutcomes
)

// counters are updated with atomics on the hot paths and read by Stats.
type counters struct {
	sent, recv               [numKinds]atomic.Uint64
	bytesSent, bytesRecv     atomic.Uint64
	asks                     [numOutcomes]atomic.Uint64
	latency                  [len(askLatencyBounds) + 1]atomic.Uint64
	latencySum               atomic.Int64 // nanoseconds
	reconnects, disconnects  atomic.Uint64
	handlerErrs, handlerPncs atomic.Uint64
	dropped                  atomic.Uint64
}

func kindIndex(k Kind) int {
	switch k {
	case KindTell:
		return 0
	case KindAsk:
		return 1
	case KindResponse:
		return 2
	case KindError:
		return 3
	default:
		return 4
	}
}

func (c *counters) countSent(k Kind, n int) {
	c.sent[kindIndex(k)].Add(1)
	c.bytesSent.Add(uint64(n))
}

func (c *counters) countRecv(k Kind, n int) {
	c.recv[kindIndex(k)].Add(1)
	c.bytesRecv.Add(uint64(n))
}

func (c *counters) observe(d time.Duration) {
	i := 0
	for i < len(askLatencyBounds) && d > askLatencyBounds[i] {
		i++
	}
	c.latency[i].Add(1)
	c.latencySum.Add(int64(d))
}

func kindCounts(a *[numKinds]atomic.Uint64) KindCounts {
	return KindCounts{a[0].Load(), a[1].Load(), a[2].Load(), a[3].Load(), a[4].Load()}
}

func (c *counters) snapshot() Stats {
	s := Stats{
		Sent:          kindCounts(&c.sent),
		Received:      kindCounts(&c.recv),
		BytesSent:     c.bytesSent.Load(),
		BytesReceived: c.bytesRecv.Load(),
		Asks: AskCounts{
			OK: c.asks[askOK].Load(), RemoteError: c.asks[askRemoteError].Load(),
			Timeout: c.asks[askTimeout].Load(), NoPeer: c.asks[askNoPeer].Load(),
			Disconnected: c.asks[askDisconnected].Load(), Failed: c.asks[askFailed].Load(),
		},
		AskLatency:    make([]LatencyBucket, len(c.latency)),
		Reconnects:    c.reconnects.Load(),
		Disconnects:   c.disconnects.Load(),
		HandlerErrors: c.handlerErrs.Load(),
		HandlerPanics: c.handlerPncs.Load(),
		Dropped:       c.dropped.Load(),
		AskLatencySum: time.Duration(c.latencySum.Load()),
	}
	for i := range c.latency {
		s.AskLatency[i].Count = c.latency[i].Load()
		if i < len(askLatencyBounds) {
			s.AskLatency[i].UpTo = askLatencyBounds[i]
		}
	}
	return s
}
