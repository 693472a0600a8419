package workerproto_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/internal/workerproto"
)

// TestFinal pins which outcomes of an ask end a worker's retries: one answer to "is
// this ERROR final?" for the native worker and the bridge alike.
func TestFinal(t *testing.T) {
	t.Parallel()
	remote := func(c bus.Code) error { return &bus.RemoteError{Path: "task.result", Code: c, Message: "x"} }
	tests := []struct {
		name  string
		err   error
		final bool
	}{
		{"Answered", nil, true},
		{"RequestRefused", remote(bus.CodeBadRequest), true},
		{"NodeClosed", fmt.Errorf("ask: %w", bus.ErrClosed), true},
		{"CoordinatorNotServing", remote(bus.CodeUnavailable), false},
		{"CoordinatorFailed", remote(bus.CodeInternal), false},
		{"WorkerForgotten", remote(bus.CodeNotFound), false},
		{"NoCoordinator", bus.ErrNoPeer, false},
		{"NoAnswerInTime", fmt.Errorf("%w: %w", bus.ErrTimeout, context.DeadlineExceeded), false},
		{"NATSDown", bus.ErrDisconnected, false},
		{"Other", errors.New("something else"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := workerproto.Final(tt.err); got != tt.final {
				t.Fatalf("Final(%v) = %v, want %v", tt.err, got, tt.final)
			}
		})
	}
}
