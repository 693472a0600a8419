package coordinator

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

func TestStoreFullErrors(t *testing.T) {
	t.Parallel()
	api := func(code jetstream.ErrorCode, desc string) error {
		return fmt.Errorf("publish: %w", &jetstream.APIError{Code: 503, ErrorCode: code, Description: desc})
	}
	for _, tc := range []struct {
		err  error
		full bool
	}{
		{api(10047, "insufficient storage resources available"), true},
		{api(10023, "insufficient resources"), true},
		{api(10002, "resource limits exceeded for account"), true},
		{api(10077, "maximum bytes exceeded"), true},
		{api(10077, "some other store failure"), false},
		{api(10071, "wrong last sequence: 4"), false},
		{errors.New("context deadline exceeded"), false},
		{nil, false},
	} {
		if got := StoreFull(tc.err); got != tc.full {
			t.Errorf("StoreFull(%v) = %v", tc.err, got)
		}
		msg := notStored("j1", tc.err).Message
		if tc.err != nil && tc.full != strings.HasPrefix(msg, "job not stored: the job store is full") {
			t.Errorf("notStored(%v) = %q", tc.err, msg)
		}
	}
	var h storeHealth
	if h.refusal() != nil {
		t.Fatal("refusal before any write")
	}
	h.noteWrite(api(10047, "insufficient storage resources available"))
	if e := h.refusal(); e == nil || !strings.Contains(e.Message, "(JetStream: insufficient storage resources available)") {
		t.Fatalf("refusal while full: %+v", e)
	}
	h.noteWrite(errors.New("timeout")) // not about room: the state stands
	if h.refusal() == nil {
		t.Fatal("a timeout lifted the refusal")
	}
	h.noteWrite(nil)
	if h.refusal() != nil {
		t.Fatal("refusal after a write succeeded")
	}
}
