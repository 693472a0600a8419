package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// TestPollingWatchEndsWhenItsClientCloses: a watch over DialTCP whose client is
// closed can never poll again: it ends, its last event carrying ErrClosed, as Watch
// says of a watch that fails. It used to poll on, failing each time unseen, and the
// channel stayed open until ctx ended: a caller ranging over it waited forever.
func TestPollingWatchEndsWhenItsClientCloses(t *testing.T) {
	t.Parallel()
	s := jobbustest.Start(t)
	c, err := client.DialTCP(context.Background(), s.StartBridge(t).ClientAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := c.Watch(ctx, client.WatchPollInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	var last error
	for end := time.After(waitLimit); ; {
		select {
		case ev, ok := <-events:
			if ok {
				last = ev.Err
				continue
			}
			if !errors.Is(last, client.ErrClosed) {
				t.Fatalf("watch of a closed client ended with %v, want ErrClosed", last)
			}
			return
		case <-end:
			t.Fatalf("watch of a closed client still open after %v", waitLimit)
		}
	}
}
