package jobbustest

import (
	"sync"
	"time"
)

// Clock is a coordinator clock (coordinator.Config.Clock) that a test moves: jobs age,
// and retries and delayed jobs come due, only when it does.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock reading now.
func NewClock(now time.Time) *Clock { return &Clock{now: now} }

// Now is the time the test last set.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
