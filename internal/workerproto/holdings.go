package workerproto

import (
	"sort"
	"sync"

	"github.com/jobbus/jobbus/bus/protocol"
)

// Holdings is what a worker reports it holds (protocol/held.go): every attempt
// assigned to it until the coordinator has acknowledged its result (or the worker gave
// up delivering it, or the coordinator revoked it), and the last mark the coordinator
// answered. The native worker keeps one; so does the bridge, for each TCP worker, from
// the assignments it forwarded. Its methods are safe for concurrent use; the zero
// value is not usable: call NewHoldings.
type Holdings struct {
	mu       sync.Mutex
	attempts map[protocol.AttemptRef]bool // done: finished, its result on its way
	// mark is the last mark received; ripe the one before it, which is what a report
	// carries (see Report).
	mark, ripe protocol.Mark
}

// NewHoldings returns empty Holdings.
func NewHoldings() *Holdings {
	return &Holdings{attempts: make(map[protocol.AttemptRef]bool)}
}

// Add records an attempt, reporting false if it was held already.
func (h *Holdings) Add(a protocol.AttemptRef) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.attempts[a]; ok {
		return false
	}
	h.attempts[a] = false
	return true
}

// Finished notes that a held attempt has finished: its result is on its way.
func (h *Holdings) Finished(a protocol.AttemptRef) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.attempts[a]; ok {
		h.attempts[a] = true
	}
}

// Remove forgets an attempt.
func (h *Holdings) Remove(a protocol.AttemptRef) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.attempts, a)
}

// Marked records the mark of a coordinator's answer; the mark it replaces ripens. A
// coordinator that does not reconcile answers none (nil), which changes nothing.
func (h *Holdings) Marked(m *protocol.Mark) {
	if m == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ripe, h.mark = h.mark, *m
}

// Reset starts a new registration's numbering: the zero mark, until its answer
// gives one.
func (h *Holdings) Reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mark, h.ripe = protocol.Mark{}, protocol.Mark{}
}

// Report is what the worker holds now, under the ripe mark: the one before the last
// received. NATS delivers the assignments a mark counts before the answer that carries
// it, but hands them to concurrent handlers (and the bridge's handlers wait until their
// worker is registered): a mark is reported only once a later answer has arrived, a
// whole round trip to the coordinator after it, so every assignment it counts that
// arrived at all has been recorded, however the handlers were scheduled. Lost ones are
// found at the second heartbeat after the answer that counted them.
func (h *Holdings) Report() *protocol.Held {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := &protocol.Held{Mark: h.ripe, Attempts: make([]protocol.HeldAttempt, 0, len(h.attempts))}
	for a, done := range h.attempts {
		out.Attempts = append(out.Attempts, protocol.HeldAttempt{AttemptRef: a, Done: done})
	}
	sort.Slice(out.Attempts, func(i, k int) bool { return out.Attempts[i].JobID < out.Attempts[k].JobID })
	return out
}
