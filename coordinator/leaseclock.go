package coordinator

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
)

// leaseClock tells whether this coordinator certainly still holds its leader lease, by
// its own monotonic clock: the lease it last renewed, counted from when the renewal was
// sent, has not run out, less a margin for the difference between clocks. A standby can
// take over only once JetStream expired the lease, which it counts from when it stored
// the renewal, later. So a coordinator that answers only while its clock says the lease
// is held cannot answer anything after another took over, however long it was paused:
// the pause shows on the monotonic clock (DESIGN invariant 3).
type leaseClock struct {
	base   time.Time
	leased atomic.Bool  // a coordinator started without Run holds no lease and answers
	until  atomic.Int64 // nanoseconds since base
	lapsed atomic.Bool  // held went false since the last extend: grace workers on renewal
}

// leaseMargin is how much of a lease a leader does not count on.
func leaseMargin(lease time.Duration) time.Duration { return lease / 5 }

// extend records a lease renewed by a request sent at sent.
func (l *leaseClock) extend(sent time.Time, lease time.Duration) {
	if l.base.IsZero() {
		panic("coordinator: leaseClock not initialised")
	}
	l.until.Store(int64(sent.Sub(l.base) + lease - leaseMargin(lease)))
	l.leased.Store(true)
}

// held reports whether the lease is certainly held now.
func (l *leaseClock) held() bool {
	if !l.leased.Load() {
		return true
	}
	if int64(time.Since(l.base)) < l.until.Load() {
		return true
	}
	l.lapsed.Store(true)
	return false
}

// errNotLeader is the answer of a coordinator whose lease may have run out.
var errNotLeader = errors.New("this coordinator's leader lease may have run out (paused, or cut off from NATS)")

// notLeader is the API's answer while the lease is not certainly held: 503, so that
// callers try again, reaching the leader.
func (a *api) notLeader() *protocol.Error {
	if err := a.store.health().failing(); err != nil { // the lease is a write too (storage.go)
		what, until := storeFaultWords(err)
		return &protocol.Error{Message: ErrNotServing.Error() + ": " + what + " (" + err.Error() +
			"), so its leader lease cannot be renewed; jobs already accepted are kept, requests are answered again once " + until}
	}
	return &protocol.Error{Message: ErrNotServing.Error() + ": " + errNotLeader.Error()}
}

// leaseLapsed is the bus handlers' answer while the lease is not certainly held.
func leaseLapsed() error { return bus.WithCode(bus.CodeUnavailable, errNotLeader) }

// RenewedLease tells the coordinator its leader lease was renewed by a request sent at
// sent, lasting lease; Run calls it. Until the first call the coordinator counts as
// holding no lease and answers everything (one started without Run). After an outage
// in which the lease lapsed, workers get a heartbeat timeout of grace: their silence
// was this coordinator's.
func (c *Coordinator) RenewedLease(sent time.Time, lease time.Duration) {
	c.lease.extend(sent, lease)
	if c.lease.lapsed.Swap(false) {
		c.sched.reg.grace()
		c.log.Info("lease renewed after it lapsed; workers get a heartbeat timeout of grace", "and", reconnectAllowance)
	}
}
