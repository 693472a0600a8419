package coordinator

import (
	"time"

	"github.com/nats-io/nats.go"
)

// reconnectAllowance is how much longer than a heartbeat timeout workers get after an
// outage of the coordinator's own: a worker's (or the bridge's) connection comes back
// on its own schedule, up to nats.go's reconnect wait (2 s, plus jitter) after the
// coordinator's did, and only then can its heartbeats arrive. With a heartbeat timeout
// shorter than that, a grace of one timeout lost a TCP worker behind a bridge whose
// connection came back 0.8 s too late (failed in CI).
const reconnectAllowance = nats.DefaultReconnectWait + time.Second

// graceWorkers gives every worker a heartbeat timeout, and the reconnect allowance, of
// grace from now: their silence was this coordinator's. Called with the scheduler's mu held.
func (reg *registry) graceWorkers(now time.Time) {
	until := now.Add(reg.s.cfg.HeartbeatTimeout + reconnectAllowance)
	for _, w := range reg.workers {
		w.graceUntil = until
	}
	reg.s.claims.extend(until) // nor could the workers claim their attempts
}

// offline is what the sweeper knows of the coordinator's own NATS connection: whether
// it was down at the last sweep, and how often it had reconnected. Guarded by
// scheduler.mu.
type offline struct {
	seen       bool
	down       bool
	reconnects uint64
}

// cutOff reports whether the coordinator's own connection is down, in which case the
// sweeper must not count the workers' silence: it is the coordinator that cannot hear
// them. Once the connection is back (or came back between sweeps), every worker gets a
// heartbeat timeout of grace, counted from now. The lease clock (leaseclock.go) pauses
// the sweeper too, but only once the lease may have lapsed, which a heartbeat timeout
// shorter than the lease outlasts: this covers the start of an outage. Called with the
// scheduler's mu held.
func (reg *registry) cutOff(now time.Time) bool {
	if reg.nc == nil { // a coordinator of the lifecycle's tests: no connection to lose
		return false
	}
	if !reg.nc.IsConnected() {
		reg.off.down = true
		return true
	}
	r := reg.nc.Stats().Reconnects
	if reg.off.seen && (reg.off.down || r != reg.off.reconnects) {
		reg.graceWorkers(now)
		reg.s.log.Info("NATS connection back; workers get a heartbeat timeout of grace", "and", reconnectAllowance)
	}
	reg.off = offline{seen: true, reconnects: r}
	return false
}
