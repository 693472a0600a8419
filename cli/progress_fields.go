package cli

import "github.com/jobbus/jobbus/bus/protocol"

// jobProgress is the job's latest progress, if its handler reported any.
func jobProgress(j protocol.Job) (fraction float64, message string, ok bool) {
	if j.Progress == nil {
		return 0, "", false
	}
	return *j.Progress, j.ProgressMessage, true
}
