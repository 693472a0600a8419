// Package reuse runs functions on goroutines that wait a moment for the next function
// before they exit. A fresh goroutine starts with a small stack that is copied, larger,
// as JSON decoding and encoding deepen it: on jobbus's hot paths (a worker's attempts,
// the bridge's result deliveries) a goroutine per call cost 3.6-3.7% of the CPU in
// stack copying. The bus reuses its handler goroutines for the same reason.
package reuse

import (
	"sync"
	"time"
)

// Idle is how long a goroutine waits for another function before it exits.
const Idle = time.Second

// Pool runs functions on reused goroutines. Its goroutines count in the wait group it
// was given, and exit when idle for Idle or when quit is closed.
type Pool struct {
	quit    <-chan struct{}
	wg      *sync.WaitGroup
	handoff chan Task
}

// Task is work for a Pool's Run: a value that already holds what its Run needs, so
// that handing it over costs no closure (Go's function would be one, allocated, for a
// caller that has the value at hand).
type Task interface{ Run() }

// funcTask is Go's function as a Task; a function is a pointer, so converting one to
// the interface allocates nothing.
type funcTask func()

func (f funcTask) Run() { f() }

// New returns a Pool whose goroutines belong to wg and end when quit closes.
func New(quit <-chan struct{}, wg *sync.WaitGroup) *Pool {
	return &Pool{quit: quit, wg: wg, handoff: make(chan Task)}
}

// Go runs fn on an idle goroutine if one waits, else on a new one.
func (p *Pool) Go(fn func()) { p.Run(funcTask(fn)) }

// Run runs t.Run on an idle goroutine if one waits, else on a new one.
func (p *Pool) Run(t Task) {
	select {
	case p.handoff <- t:
	default:
		p.wg.Add(1)
		go p.loop(t)
	}
}

func (p *Pool) loop(t Task) {
	defer p.wg.Done()
	idle := time.NewTimer(Idle)
	defer idle.Stop()
	for {
		t.Run()
		idle.Reset(Idle)
		select {
		case t = <-p.handoff:
		case <-idle.C:
			return
		case <-p.quit:
			return
		}
	}
}
