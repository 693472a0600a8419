package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// cancelWhenAsked is a caller's context that the caller cancels, once armed, the next
// time the client asks it for its deadline, as it does as each request begins: here,
// right after a batch's answer, before the client sends its open submissions again.
type cancelWhenAsked struct {
	context.Context
	cancel context.CancelFunc
	armed  *atomic.Bool
}

func (c cancelWhenAsked) Deadline() (time.Time, bool) {
	if c.armed.Load() {
		c.cancel()
	}
	return c.Context.Deadline()
}

// TestSubmitManyKeepsOpenOutcomesWhenNotSentAgain: a submission of a batch answered
// "Outcome unknown" is sent again; when that send never goes (the caller cancelled in
// between), its result is still "Outcome unknown" naming its job, which may be stored,
// not the bare context error the send again failed with, which says nothing was.
func TestSubmitManyKeepsOpenOutcomesWhenNotSentAgain(t *testing.T) {
	t.Parallel()
	nc := jobbustest.Start(t, jobbustest.WithoutCoordinator()).NC
	armed := new(atomic.Bool)
	var sends atomic.Int32
	sub, err := nc.Subscribe(submitManySubject, func(m *nats.Msg) {
		sends.Add(1)
		rid := batchRequestIDs(t, m.Data)[0]
		unknown := protocol.OutcomeUnknown("submission", protocol.RequestJobID(rid), "not confirmed in time")
		armed.Store(true) // the caller cancels once this answer is in
		_ = m.Respond(mustEncode(&protocol.JobsSubmitted{Answers: []json.RawMessage{mustEncode(unknown)}}))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	inner, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctx := cancelWhenAsked{Context: inner, cancel: cancel, armed: armed}
	res, err := client.New(nc).SubmitMany(ctx, []client.Submission{{TaskType: "SHA256", Payload: map[string]string{"text": "x"}}})
	if !errors.Is(err, context.Canceled) || sends.Load() != 1 {
		t.Fatalf("SubmitMany = %v after %d sends; want context.Canceled after 1: the test cancels before the send again", err, sends.Load())
	}
	if _, named := client.OutcomeJob(res[0].Err); !errors.Is(res[0].Err, client.ErrOutcomeUnknown) || !named {
		t.Fatalf("submission answered Outcome unknown, not sent again = %v; want Outcome unknown naming its job", res[0].Err)
	}
}
