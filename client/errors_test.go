package client_test

import (
	"errors"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

func TestServerErrorKinds(t *testing.T) {
	t.Parallel()
	cases := []struct {
		msg           string
		noCoordinator bool
	}{
		{protocol.CoordinatorUnavailable("no reply within 5s").Message, true},
		{"Unknown job: x", false},
		{"Invalid payload: Payload must be a JSON object", false},
	}
	for _, tc := range cases {
		err := error(&client.ServerError{Message: tc.msg})
		if !errors.Is(err, client.ErrServer) {
			t.Errorf("%q: not ErrServer", tc.msg)
		}
		if errors.Is(err, client.ErrNoCoordinator) != tc.noCoordinator {
			t.Errorf("%q: errors.Is(ErrNoCoordinator) = %v, want %v", tc.msg, !tc.noCoordinator, tc.noCoordinator)
		}
	}
}
