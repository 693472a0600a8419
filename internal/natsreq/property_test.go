package natsreq_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/natsreq"
	"github.com/jobbus/jobbus/internal/testkit"
)

// A responder is one coordinator serving the submission subject, without a queue group
// as the API is served, so every one gets every send. It acts as its role says on each
// send it gets; stored records that it acted on one (stored the job).
type responder struct {
	role     role
	delay    time.Duration // before a storer's answer
	refusals int           // sends a failover's new leader refuses before it serves
	sends    int           // sends it got (its subscription's handler only)
}

type role int

const (
	refuser      role = iota // deposed: refuses every send at once (503), acts on nothing
	swallower                // frozen: takes every send, acts on nothing, answers nothing
	storer                   // leader: stores, answers JOB_SUBMITTED after delay
	storeUnknown             // leader whose write was not confirmed: stores, answers Outcome unknown
	storeFrozen              // stores, then freezes: never answers
	newLeader                // refuses its first refusals sends (not serving yet), then a storer
	numRoles
)

func (r role) String() string {
	return [...]string{"refuser", "swallower", "storer", "storeUnknown", "storeFrozen", "newLeader"}[r]
}

// handle serves one send.
func (r *responder) handle(m *nats.Msg, stored *atomic.Bool) {
	r.sends++
	switch r.role {
	case refuser:
		answerNotServing(m)
	case swallower, storeFrozen:
		if r.role == storeFrozen {
			stored.Store(true)
		}
	case storer:
		stored.Store(true)
		time.Sleep(r.delay)
		_ = m.Respond([]byte("JOB_SUBMITTED"))
	case storeUnknown:
		stored.Store(true)
		u := nats.NewMsg(m.Reply)
		u.Header.Set(micro.ErrorCodeHeader, "504")
		u.Header.Set(micro.ErrorHeader, protocol.OutcomeUnknown("submission", "j", "no quorum").Message)
		_ = m.RespondMsg(u)
	case newLeader:
		if r.sends <= r.refusals {
			answerNotServing(m)
			return
		}
		stored.Store(true)
		time.Sleep(r.delay)
		_ = m.Respond([]byte("JOB_SUBMITTED"))
	}
}

// TestSubmissionNeverSaysNotStoredWhenStored holds Request to "an error means not
// stored", for a submission and a batch of them, over random sets of coordinators serving a submission at once (a deposed
// one refusing, a frozen one, a leader answering late, one whose write is unconfirmed,
// a new leader that starts serving after a few refusals): whatever ends the request,
// it says the job was not stored only when no coordinator stored it, and says it was
// submitted only when one did.
func TestSubmissionNeverSaysNotStoredWhenStored(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range 16 {
		// A batch of submissions (SUBMIT_JOBS) is held to the same rule.
		typ := []protocol.Type{protocol.TypeSubmitJob, protocol.TypeSubmitJobs}[i%2]
		// The request's time as a context's deadline, or as Options.Within (the
		// client's, when its caller's context has none) with a context that cannot
		// end otherwise (waited for with nats.go's timer) or that can (with one of
		// its own): each wait of the three shapes holds the rule.
		b := bound((i / 2) % int(numBounds))
		n := 1 + rng.IntN(3)
		rs := make([]*responder, n)
		for k := range rs {
			rs[k] = &responder{role: role(rng.IntN(int(numRoles))), delay: time.Duration(rng.IntN(700)) * time.Millisecond, refusals: 1 + rng.IntN(3)}
		}
		within := time.Duration(150+rng.IntN(800)) * time.Millisecond
		name := fmt.Sprintf("%d-%s-%s", i, typ, b)
		for _, r := range rs {
			name += "-" + r.role.String()
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			submissionHolds(t, typ, rs, within, b)
		})
	}
}

// bound is how a request's time is bounded.
type bound int

const (
	byDeadline         bound = iota // the context's deadline
	byWithin                        // Options.Within, the context never done
	byWithinCancelable              // Options.Within, the context cancelable
	numBounds
)

func (b bound) String() string {
	return [...]string{"deadline", "within", "within-cancelable"}[b]
}

func submissionHolds(t *testing.T, typ protocol.Type, rs []*responder, within time.Duration, b bound) {
	nc := connect(t)
	submit, _ := protocol.EndpointFor(typ)
	var stored atomic.Bool
	// A responder may still be answering (a storer's delay) when the request ends:
	// the test waits for it, so that no handler outlives it (goleak).
	var handling atomic.Int32
	t.Cleanup(func() { // after the unsubscribes below
		testkit.Eventually(t, 10*time.Second, "the responders' handlers done", func() bool { return handling.Load() == 0 })
	})
	for _, r := range rs {
		sub, err := nc.Subscribe(submit.Subject(), func(m *nats.Msg) {
			handling.Add(1)
			defer handling.Add(-1)
			r.handle(m, &stored)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	ctx, opts := context.Background(), natsreq.Options{}
	switch b {
	case byDeadline:
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, within)
		defer cancel()
	case byWithinCancelable:
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		fallthrough
	case byWithin:
		opts.Within = within
	}
	m, err := natsreq.Request(ctx, nc, submit.Subject(), nil, opts)
	// What the caller (the client, the bridge) makes of the ending: a reply that is no
	// error header is the coordinator's answer; a 503 reply, or no responders, means
	// nothing was stored; a 504, a timeout, a cut-off or a RefusedError mean the
	// outcome is unknown (the job its request id names may exist).
	var notStored, submitted bool
	switch {
	case err == nil && m.Header.Get(micro.ErrorCodeHeader) == "":
		submitted = string(m.Data) == "JOB_SUBMITTED"
		if !submitted {
			t.Fatalf("a reply no responder sent: %q", m.Data)
		}
	case err == nil:
		notStored = m.Header.Get(micro.ErrorCodeHeader) == "503"
	case errors.Is(err, nats.ErrNoResponders):
		notStored = true
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, natsreq.ErrCutOff):
	default:
		t.Fatalf("unexpected ending: %v", err)
	}
	if notStored && stored.Load() {
		t.Fatalf("the request ended saying nothing was stored (%v, %v), but a coordinator stored the job", m, err)
	}
	if submitted && !stored.Load() {
		t.Fatal("the request ended submitted, but no coordinator stored the job")
	}
}
