package coordinator

import "time"

// offline is what the sweeper knows of the coordinator's own NATS connection: whether
// it was down at the last sweep, and how often it had reconnected. Guarded by
// Coordinator.mu.
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
// shorter than the lease outlasts: this covers the start of an outage. Called with c.mu
// held.
func (c *Coordinator) cutOff(now time.Time) bool {
	if !c.nc.IsConnected() {
		c.off.down = true
		return true
	}
	r := c.nc.Stats().Reconnects
	if c.off.seen && (c.off.down || r != c.off.reconnects) {
		for _, w := range c.workers {
			w.lastSeen = now
		}
		c.log.Info("NATS connection back; workers get a heartbeat timeout of grace")
	}
	c.off = offline{seen: true, reconnects: r}
	return false
}
