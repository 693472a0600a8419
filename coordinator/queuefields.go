package coordinator

import "github.com/jobbus/jobbus/bus/protocol"

// queueOf is the name of j's queue: "" in the record is the default one.
func queueOf(j *job) string { return protocol.QueueOf(j.rec.Queue) }

// keyOf is j's concurrency key; "" for none.
func keyOf(j *job) string { return j.rec.ConcurrencyKey }

// agingFrom is when j began to wait (Record.AgingFrom).
func agingFrom(j *job) int64 { return j.rec.AgingFrom() }
