package coordinator

import (
	"github.com/jobbus/jobbus/bus/protocol"
)

// serveWorkflow serves the workflow endpoints (jobbus.api.workflow.*).
func (a *api) serveWorkflow(msg protocol.Message, from request, reply func(protocol.Message)) {
	switch m := msg.(type) {
	case *protocol.SubmitWorkflow:
		a.sched.submitGroup(m, from, reply)
	case *protocol.GetWorkflow:
		reply(a.sched.groupStatus(m.WorkflowID))
	case *protocol.CancelWorkflow:
		a.sched.cancelGroup(m.WorkflowID, from.due, reply)
	case *protocol.RetryWorkflow:
		a.sched.retryGroup(m.WorkflowID, from, reply)
	default:
		reply(&protocol.Error{Message: "unexpected request " + string(msg.MessageType())})
	}
}
