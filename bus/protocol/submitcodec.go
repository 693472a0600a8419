package protocol

import (
	"bytes"
	"encoding/json"
)

// A JOBS_SUBMITTED is written on the coordinator's hot path, once per batch: each
// answer is already a message's encoding (the bytes a submission alone gets), which
// json.Marshal would only check and copy, twice (its buffer, then encode's).
// FuzzHotEncode holds the encoder below to encoding/json's.

// appendFast writes m as marshalSlow does, each answer copied as it is, when
// json.Marshal would copy every answer unchanged (skipValue's exact: valid, compact,
// none of the characters it escapes); ok is false otherwise.
func (m JobsSubmitted) appendFast() (b []byte, ok bool) {
	if m.Answers == nil {
		return nil, false
	}
	const head = `{"type":"JOBS_SUBMITTED","answers":[`
	n := len(head) + 2
	for _, a := range m.Answers {
		n += len(a) + 1
	}
	b = make([]byte, 0, n)
	b = append(b, head...)
	for i, a := range m.Answers {
		if end, exact := skipValue(a, 0, 0); end != len(a) || !exact {
			return nil, false
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, a...)
	}
	return append(b, "]}"...), true
}

// marshalSlow is encoding/json's encoding, for what the fast one leaves.
func (m JobsSubmitted) marshalSlow() ([]byte, error) {
	type plain JobsSubmitted
	return encode(m.MessageType(), plain(m))
}

// A SUBMIT_JOBS is written by a client once per batch, each submission already a
// message's encoding (protocol.Encode of its SUBMIT_JOB).

// appendFast writes m as marshalSlow does, each submission copied as it is, when
// json.Marshal would copy every submission unchanged and every request id needs no
// escaping; ok is false otherwise.
func (m SubmitJobs) appendFast() (b []byte, ok bool) {
	if m.Jobs == nil {
		return nil, false
	}
	const head = `{"type":"SUBMIT_JOBS","jobs":[`
	n := len(head) + 2
	for _, j := range m.Jobs {
		n += len(j.RequestID) + len(j.Submit) + 30
	}
	b = make([]byte, 0, n)
	b = append(b, head...)
	for i, j := range m.Jobs {
		if end, exact := skipValue(j.Submit, 0, 0); end != len(j.Submit) || !exact {
			return nil, false
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		if j.RequestID != "" {
			var plain bool
			b = append(b, `"requestId":`...)
			if b, plain = appendString(b, j.RequestID); !plain {
				return nil, false
			}
			b = append(b, ',')
		}
		b = append(b, `"submit":`...)
		b = append(b, j.Submit...)
		b = append(b, '}')
	}
	return append(b, "]}"...), true
}

// marshalSlow is encoding/json's encoding, for what the fast one leaves.
func (m SubmitJobs) marshalSlow() ([]byte, error) {
	type plain SubmitJobs
	return encode(m.MessageType(), plain(m))
}

// A SUBMIT_JOBS is read on the coordinator's hot path, once per batch of submissions:
// encoding/json took ~3 µs a submission for it (reflection, a validating pass, then a
// copy and a string per submission), a tenth of what the whole system spends on a job.
// The scanner below reads the batch as MarshalJSON writes it, in one pass, each
// submission's text kept as it is for Decode (SubmitJob's own scanner reads it), and
// leaves every other form to encoding/json: the outcome, errors included, is
// encoding/json's. FuzzSubmitJobsDecode holds it to that.

// DecodeJSON decodes data into m exactly as json.Unmarshal(data, m) does.
func (m *SubmitJobs) DecodeJSON(data []byte) error { return decodeJSON(m, data) }

// scan reads a SubmitJobs written as MarshalJSON writes it: {"type":"SUBMIT_JOBS",
// "jobs":[...]}, each submission {"requestId":"...","submit":{...}} or
// {"submit":{...}}, its request id of printable ASCII without escapes. ok is false, m
// untouched, for anything else. exact is always false: Decode's word for the messages
// other than the hot four. The submissions' texts and request ids are read out of one
// copy of data each (m does not hold on to data, whose buffer its reader may reuse).
func (m *SubmitJobs) scan(data []byte) (exact, ok bool) {
	const head = `{"type":"SUBMIT_JOBS","jobs":[`
	if m.Jobs != nil || !hasPrefix(data, head) {
		return false, false
	}
	own, text := bytes.Clone(data), string(data)
	// MarshalJSON writes each submission's "submit" key: there are at least as many of
	// them as submissions.
	jobs := make([]BatchedSubmission, 0, bytes.Count(data, []byte(`"submit":`)))
	i := len(head)
	for i < len(data) && data[i] != ']' {
		if len(jobs) > 0 {
			if data[i] != ',' {
				return false, false
			}
			i++
		}
		var job BatchedSubmission
		if i = scanSubmission(data, i, own, text, &job); i < 0 {
			return false, false
		}
		jobs = append(jobs, job)
	}
	if string(data[i:]) != "]}" {
		return false, false
	}
	m.Jobs = jobs
	return false, true
}

// scanSubmission reads the submission at data[i] into job, its request id a substring
// of text and its text a slice of own (both copies of data), and returns the index
// just past it; -1 for anything but {"requestId":"...","submit":{...}} or
// {"submit":{...}}.
func scanSubmission(data []byte, i int, own []byte, text string, job *BatchedSubmission) int {
	const id, submit = `{"requestId":"`, `"submit":`
	switch {
	case hasPrefix(data[i:], id):
		i += len(id)
		start := i
		for ; i < len(data) && data[i] != '"'; i++ {
			if c := data[i]; c < 0x20 || c == '\\' || c >= 0x80 {
				return -1
			}
		}
		if i >= len(data) {
			return -1
		}
		job.RequestID = text[start:i]
		if i++; i >= len(data) || data[i] != ',' {
			return -1
		}
		i++
	case hasPrefix(data[i:], "{"):
		i++
	default:
		return -1
	}
	if !hasPrefix(data[i:], submit) {
		return -1
	}
	i += len(submit)
	if i >= len(data) || data[i] != '{' { // null, or what SubmitJob is not, is encoding/json's
		return -1
	}
	end, _ := skipValue(data, i, 0)
	if end < 0 || end >= len(data) || data[end] != '}' {
		return -1
	}
	job.Submit = json.RawMessage(own[i:end:end])
	return end + 1
}

// A JOBS_SUBMITTED is read by the bridge once per batch it forwards: its answers hold
// "type" keys, so PeekType and then encoding/json each took a validating pass over the
// whole message (about 3% of the system's CPU through the TCP ports). The scanner
// reads it as MarshalJSON writes it, in one pass, each answer an object kept as it is,
// and leaves every other form to encoding/json. FuzzJobsSubmittedDecode holds it to
// json.Unmarshal.

// DecodeJSON decodes data into m exactly as json.Unmarshal(data, m) does.
func (m *JobsSubmitted) DecodeJSON(data []byte) error { return decodeJSON(m, data) }

// scan reads a JobsSubmitted written as MarshalJSON writes it:
// {"type":"JOBS_SUBMITTED","answers":[{...},...]}. ok is false, m untouched, for
// anything else. exact is always false (Decode's word for all but the hot four). The
// answers are slices of one copy of data.
func (m *JobsSubmitted) scan(data []byte) (exact, ok bool) {
	const head = `{"type":"JOBS_SUBMITTED","answers":[`
	if m.Answers != nil || !hasPrefix(data, head) {
		return false, false
	}
	own := bytes.Clone(data)
	answers := make([]json.RawMessage, 0, bytes.Count(data, []byte(`{"type":`)))
	i := len(head)
	for i < len(data) && data[i] != ']' {
		if len(answers) > 0 {
			if data[i] != ',' {
				return false, false
			}
			i++
		}
		if i >= len(data) || data[i] != '{' { // what no coordinator answers is encoding/json's
			return false, false
		}
		end, _ := skipValue(data, i, 0)
		if end < 0 {
			return false, false
		}
		answers = append(answers, json.RawMessage(own[i:end:end]))
		i = end
	}
	if string(data[i:]) != "]}" {
		return false, false
	}
	m.Answers = answers
	return false, true
}
