package protocol

import "encoding/json"

// PathResults: a native worker asks TaskResults, several results in one ask; the
// coordinator answers ResultAcks, one answer per result, once every accepted result's
// outcome is durable. A coordinator that serves it says so in WorkerRegistered.Results;
// with one that does not (an older one), or when nobody answers on this path, the
// worker delivers its results one by one on PathResult, which every coordinator serves.
const PathResults = "task.results"

// MaxResults is the most results a coordinator takes in one TaskResults; it says so in
// WorkerRegistered.Results, and refuses a larger batch (bus.CodeBadRequest).
const MaxResults = 256

// TaskResults carries the results of several of one worker's attempts in one ask
// (PathResults, a native extension of the worker protocol, which the bridge also
// speaks for its TCP workers; never sent to a spec peer). Each result is a whole
// TASK_RESULT, type included, whose WorkerID must be the batch's. It is the group
// commit of results: results that finish while one delivery is in flight go together
// in the next.
type TaskResults struct {
	WorkerID string       `json:"workerId"`
	Results  []TaskResult `json:"results"`
}

// Worker names the worker that reports the results.
func (m *TaskResults) Worker() string { return m.WorkerID }

// ResultAcks answers TaskResults: Acks[i] answers Results[i].
type ResultAcks struct {
	Acks []ResultAnswer `json:"acks"`
}

// ResultAnswer is the answer to one result of a TaskResults: what a ResultAck would
// say, or, with Code set, the error a single result's ask would have got (a bus error
// code: 503 the result is not known durable and must be offered again, here or to the
// next leader; 403 the attempt is another worker's).
type ResultAnswer struct {
	JobID    string `json:"jobId"`
	Accepted bool   `json:"accepted"`
	Code     int    `json:"code,omitempty"`
	Error    string `json:"error,omitempty"`
}

// MarshalJSON writes each result as its own MarshalJSON does, in one buffer: a
// TaskResults is encoded for every delivery, and json.Marshal would check and copy
// every result's bytes again.
func (m TaskResults) MarshalJSON() ([]byte, error) {
	n := 48 + len(m.WorkerID)
	for i := range m.Results {
		r := &m.Results[i]
		n += 128 + len(r.WorkerID) + len(r.JobID) + len(r.AttemptID) + strLen(r.Result) + strLen(r.Error)
	}
	b := make([]byte, 0, n)
	b = append(b, `{"workerId":`...)
	b, ok := appendString(b, m.WorkerID)
	if !ok {
		type plain TaskResults
		return json.Marshal(plain(m))
	}
	if m.Results == nil {
		return append(b, `,"results":null}`...), nil
	}
	b = append(b, `,"results":[`...)
	b, err := appendList(b, m.Results)
	if err != nil {
		return nil, err
	}
	return append(b, "]}"...), nil
}

// DecodeJSON decodes data into m exactly as json.Unmarshal(data, m) does (bus.Decoder).
// The batch as MarshalJSON writes it ({"workerId":"...","results":[...]}, each result
// as TaskResult's scanner reads it) is read in one pass; anything else is left to
// json.Unmarshal. FuzzResultsDecode holds it to that.
func (m *TaskResults) DecodeJSON(data []byte) error {
	if m.WorkerID == "" && m.Results == nil {
		if id, results, ok := scanResults(data); ok {
			m.WorkerID, m.Results = id, results
			return nil
		}
	}
	return json.Unmarshal(data, m)
}

// scanResults reads a TaskResults written as MarshalJSON writes it, with a worker id
// of plain ASCII (no escapes); ok is false for anything else.
func scanResults(data []byte) (workerID string, results []TaskResult, ok bool) {
	const head = `{"workerId":"`
	if !hasPrefix(data, head) {
		return "", nil, false
	}
	i := len(head)
	start := i
	for ; i < len(data); i++ {
		c := data[i]
		if c == '"' {
			break
		}
		if c < 0x20 || c == '\\' || c >= 0x80 {
			return "", nil, false
		}
	}
	if i >= len(data) {
		return "", nil, false
	}
	workerID = string(data[start:i])
	i++
	const mid = `,"results":[`
	if !hasPrefix(data[i:], mid) {
		return "", nil, false
	}
	i += len(mid)
	results, i, ok = scanList[TaskResult](data, i)
	if !ok || string(data[i:]) != "]}" {
		return "", nil, false
	}
	return workerID, results, true
}
