package coordinator

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// JetStream's error codes for a write refused for want of room (nats-server's
// errors.json): the account's or the server's storage limit, or a stream's.
const (
	codeAccountResourcesExceeded jetstream.ErrorCode = 10002
	codeInsufficientResources    jetstream.ErrorCode = 10023
	codeStorageResourcesExceeded jetstream.ErrorCode = 10047
	codeStreamStoreFailed        jetstream.ErrorCode = 10077 // with "maximum bytes exceeded"
)

// StoreFull reports a write JetStream refused because its store has no room.
func StoreFull(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case codeAccountResourcesExceeded, codeInsufficientResources, codeStorageResourcesExceeded:
		return true
	case codeStreamStoreFailed:
		return strings.Contains(apiErr.Description, "maximum bytes exceeded")
	}
	return false
}

// storeHealth remembers whether the last job write found the store full. Writes set
// and clear it from the writer goroutines, without c.mu.
type storeHealth struct {
	full atomic.Pointer[string] // JetStream's words, while full
}

// noteWrite records the outcome of one job write.
func (h *storeHealth) noteWrite(err error) {
	switch {
	case err == nil:
		h.full.Store(nil)
	case StoreFull(err):
		var apiErr *jetstream.APIError
		errors.As(err, &apiErr)
		desc := apiErr.Description
		h.full.Store(&desc)
	}
}

// refusal is the ERROR a submission gets at once while the store is full, nil
// otherwise. A job already being written keeps being retried (running jobs are not
// lost), so the first write that succeeds again, when space returns, lifts it.
func (h *storeHealth) refusal() *protocol.Error {
	desc := h.full.Load()
	if desc == nil {
		return nil
	}
	return storeFullError(*desc)
}

func storeFullError(desc string) *protocol.Error {
	return &protocol.Error{Message: "job not stored: the job store is full (JetStream: " + desc +
		"); jobs already accepted are kept and go on, new ones are refused until space is freed " +
		"or the limit raised (jobbus serve --nats-max-store, or the NATS server's max_file_store)"}
}

// notStored is the ERROR of a submission whose record could not be written.
func notStored(id string, err error) *protocol.Error {
	var apiErr *jetstream.APIError
	if StoreFull(err) && errors.As(err, &apiErr) {
		return storeFullError(apiErr.Description)
	}
	return &protocol.Error{Message: fmt.Sprintf("job %s was not stored: %v", id, err)}
}
