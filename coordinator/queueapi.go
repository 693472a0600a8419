package coordinator

import (
	"fmt"

	"github.com/jobbus/jobbus/bus/protocol"
)

// serveQueues serves the queue API (jobbus.api.queue.*).
func (a *api) serveQueues(m protocol.Message, from request, reply replyFunc) {
	reply(&protocol.Error{Message: fmt.Sprintf("Unsupported request: %s", m.MessageType())})
}
