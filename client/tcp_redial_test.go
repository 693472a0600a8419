package client_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// TestTCPCallersRedialTogetherOnOneConnection: when the connection breaks, the many
// callers that find it gone at once dial one new connection between them, not one
// each; and Close, which closes the connection the client holds, returns, leaving
// nothing open. (Each caller used to dial its own: the last one dialled was kept, the
// others went on serving their callers unknown to the client, and Close waited for
// their readers until the bridge hung up, which it never does to an idle client.)
func TestTCPCallersRedialTogetherOnOneConnection(t *testing.T) {
	t.Parallel()
	const callers, breaks = 32, 3
	p := newBridgePeer(t, func(n int, req protocol.Message) response {
		if s, ok := req.(*protocol.GetJobStatus); ok && s.JobID == "hang-up" {
			return response{hangUp: true}
		}
		return answer(n, req)
	})
	c, err := client.DialTCP(context.Background(), p.addr()) // closed by the test: Close is what it checks
	if err != nil {
		t.Fatal(err)
	}
	for b := range breaks {
		if _, err := c.Status(context.Background(), "hang-up"); err == nil {
			t.Fatal("Status answered by hanging up succeeded")
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				<-start
				id := fmt.Sprintf("break %d caller %d", b, i)
				if job, err := c.Status(context.Background(), id); err != nil || job.JobID != id {
					t.Errorf("Status(%s) = %+v, %v", id, job, err)
				}
			})
		}
		close(start) // all at once, as callers woken together after a break do
		wg.Wait()
	}
	if got, want := p.accepts.Load(), int32(breaks+1); got != want {
		t.Errorf("%d connections dialled, want %d: the first and one after each break", got, want)
	}
	closed := make(chan struct{})
	go func() {
		_ = c.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(2 * time.Second):
		p.close() // hangs up on every connection, which lets such a Close return
		<-closed
		t.Fatal("Close did not return: it waited for connections the client no longer held")
	}
}
