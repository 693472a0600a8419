package protocol

import "encoding/json"

// PathAssigns: the coordinator tells TaskAssigns, several assignments in one tell, to
// a worker that said it takes them (WorkerRegister.Assigns: a native worker, and the
// bridge for each TCP worker, which writes each assignment to it as a TASK_ASSIGN
// frame of its own). To such a worker every assignment goes on this path, one alone as
// a batch of one, so that its assignments arrive on one subscription, in the order
// they were made; to any other (an older native worker or bridge) each goes alone as
// a TaskAssign on PathAssign.
const PathAssigns = "task.assigns"

// MaxAssigns is the most assignments a coordinator puts in one TaskAssigns, whatever
// a worker says it takes.
const MaxAssigns = 256

// TaskAssigns carries several assignments to one worker in one tell (PathAssigns, a
// native extension of the worker protocol; never sent to a spec peer). Each is a whole
// TASK_ASSIGN, type included, and counts for reconciliation exactly as if it had been
// sent alone, in its place in the batch (held.go): the assignments that one flush of
// the coordinator's decisions sends to a worker go together.
type TaskAssigns struct {
	Assigns []TaskAssign `json:"assigns"`
}

// MarshalJSON writes each assignment as its own MarshalJSON does, in one buffer: a
// TaskAssigns is encoded for every batch, and json.Marshal would check and copy every
// assignment's bytes again.
func (m TaskAssigns) MarshalJSON() ([]byte, error) {
	if m.Assigns == nil {
		return []byte(`{"assigns":null}`), nil
	}
	n := 16
	for i := range m.Assigns {
		a := &m.Assigns[i]
		n += 128 + len(a.JobID) + len(a.AttemptID) + len(a.TaskType) + len(a.Payload) + len(a.TraceParent) + len(a.TraceState)
	}
	b := make([]byte, 0, n)
	b = append(b, `{"assigns":[`...)
	b, err := appendList(b, m.Assigns)
	if err != nil {
		return nil, err
	}
	return append(b, "]}"...), nil
}

// DecodeJSON decodes data into m exactly as json.Unmarshal(data, m) does (bus.Decoder).
// The batch as MarshalJSON writes it ({"assigns":[...]}, each assignment as
// TaskAssign's scanner reads it) is read in one pass; anything else is left to
// json.Unmarshal. FuzzAssignsDecode holds it to that.
func (m *TaskAssigns) DecodeJSON(data []byte) error {
	if m.Assigns == nil {
		if assigns, ok := scanAssigns(data); ok {
			m.Assigns = assigns
			return nil
		}
	}
	return json.Unmarshal(data, m)
}

// scanAssigns reads a TaskAssigns written as MarshalJSON writes it; ok is false for
// anything else.
func scanAssigns(data []byte) (assigns []TaskAssign, ok bool) {
	const head = `{"assigns":[`
	if !hasPrefix(data, head) {
		return nil, false
	}
	assigns, i, ok := scanList[TaskAssign](data, len(head))
	if !ok || string(data[i:]) != "]}" {
		return nil, false
	}
	return assigns, true
}

// SplitAssigns returns the assignments of a TaskAssigns as they are written in data,
// each the bytes a TaskAssign sent alone on PathAssign would carry: the bridge relays
// each to its TCP worker as a TASK_ASSIGN frame of its own, as it relays a single one.
// A batch as MarshalJSON writes it is cut without decoding (the slices share data's
// array); anything else is left to json.Unmarshal.
func SplitAssigns(data []byte) ([]json.RawMessage, error) {
	if assigns, ok := splitAssigns(data); ok {
		return assigns, nil
	}
	var m struct {
		Assigns []json.RawMessage `json:"assigns"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	return m.Assigns, nil
}

// splitAssigns cuts a TaskAssigns written as MarshalJSON writes it; ok is false for
// anything else.
func splitAssigns(data []byte) (assigns []json.RawMessage, ok bool) {
	const head = `{"assigns":[`
	if !hasPrefix(data, head) {
		return nil, false
	}
	i := len(head)
	if i < len(data) && data[i] == ']' {
		return []json.RawMessage{}, string(data[i:]) == "]}"
	}
	for {
		end, _ := skipValue(data, i, 0)
		if end < 0 || end >= len(data) || data[i] != '{' {
			return nil, false
		}
		assigns = append(assigns, data[i:end:end])
		switch data[end] {
		case ',':
			i = end + 1
		case ']':
			return assigns, string(data[end:]) == "]}"
		default:
			return nil, false
		}
	}
}
