package protocol

// ReadOnly reports whether a client request of type t changes nothing (GET_JOB_STATUS,
// LIST_JOBS, LIST_WORKERS, LIST_TASK_TYPES): one that went unanswered may be sent
// again, to whichever coordinator answers. A submission is sent again only under its
// request id (HeaderRequestID), which finds the job an earlier send created; a cancel
// never once it may have been received: whether it was acted on is unknown.
// internal/natsreq.Request acts on this for the client and the bridge.
func ReadOnly(t Type) bool {
	switch t {
	case TypeGetJobStatus, TypeListJobs, TypeListWorkers, TypeListTaskTypes, TypeGetWorkflow, TypeListSchedules, TypeListQueues, TypeListLimits:
		return true
	}
	return false
}

// ReadOnlySubject reports whether the client API endpoint on subject serves a ReadOnly
// request.
func ReadOnlySubject(subject string) bool {
	t, ok := RequestOn(subject)
	return ok && ReadOnly(t)
}
