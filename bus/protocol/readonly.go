package protocol

// ReadOnly reports whether a client request of type t changes nothing (GET_JOB_STATUS,
// LIST_JOBS, LIST_WORKERS): one that went unanswered may be sent again, to whichever
// coordinator answers. A submission or a cancel is never sent again by jobbus: whether
// it was acted on is unknown.
func ReadOnly(t Type) bool {
	switch t {
	case TypeGetJobStatus, TypeListJobs, TypeListWorkers:
		return true
	}
	return false
}

// ReadOnlySubject reports whether the client API endpoint on subject serves a ReadOnly
// request.
func ReadOnlySubject(subject string) bool {
	for _, e := range Endpoints {
		if e.Subject() == subject {
			return ReadOnly(e.Request)
		}
	}
	return false
}
