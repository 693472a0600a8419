package cli

import "github.com/jobbus/jobbus/bus/protocol"

// jobProgress is the job's latest progress, if its handler reported any.
func jobProgress(j protocol.Job) (fraction float64, message string, ok bool) {
	return 0, "", false // until the foundation's snapshot fields land
}
