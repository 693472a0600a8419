package protocol

import (
	"encoding/json"
	"strconv"
)

// answerLayout is a ResultAnswer as encoding/json writes it (code and error left out
// when zero).
var answerLayout = newLayout("", 2, field{name: "jobId", kind: kindString}, field{name: "accepted", kind: kindBool},
	field{name: "code", kind: kindInt}, field{name: "error", kind: kindString})

// MarshalJSON writes each answer in one buffer as encoding/json would: a ResultAcks
// answers every batch of results, and json.Marshal would reach each field by
// reflection.
func (m ResultAcks) MarshalJSON() ([]byte, error) {
	if m.Acks == nil {
		return []byte(`{"acks":null}`), nil
	}
	b := make([]byte, 0, 16+len(m.Acks)*64)
	b = append(b, `{"acks":[`...)
	b, err := appendList(b, m.Acks)
	if err != nil {
		return nil, err
	}
	return append(b, "]}"...), nil
}

func (a ResultAnswer) marshalSlow() ([]byte, error) { return json.Marshal(a) }

// appendFast writes a as encoding/json does, when its strings need no escaping that
// appendString leaves to encoding/json.
func (a *ResultAnswer) appendFast(b []byte) ([]byte, bool) {
	b = append(b, `{"jobId":`...)
	b, ok1 := appendString(b, a.JobID)
	b = append(b, `,"accepted":`...)
	b = strconv.AppendBool(b, a.Accepted)
	if a.Code != 0 {
		b = append(b, `,"code":`...)
		b = strconv.AppendInt(b, int64(a.Code), 10)
	}
	ok2 := true
	if a.Error != "" {
		b = append(b, `,"error":`...)
		b, ok2 = appendString(b, a.Error)
	}
	return append(b, '}'), ok1 && ok2
}

// DecodeJSON decodes data into m exactly as json.Unmarshal(data, m) does (bus.Decoder).
// The answers as MarshalJSON writes them ({"acks":[...]}) are read in one pass;
// anything else is left to json.Unmarshal. FuzzResultAcksDecode holds it to that.
func (m *ResultAcks) DecodeJSON(data []byte) error {
	const head = `{"acks":[`
	if m.Acks == nil && hasPrefix(data, head) {
		if acks, i, ok := scanList[ResultAnswer](data, len(head)); ok && string(data[i:]) == "]}" {
			m.Acks = acks
			return nil
		}
	}
	return json.Unmarshal(data, m)
}

func (a *ResultAnswer) scan(data []byte) (exact, ok bool) {
	var v [4]value
	all, exact, ok := scanObject(data, answerLayout, v[:])
	if !ok {
		return false, false
	}
	v[0].str(&a.JobID, all)
	v[1].boolean(&a.Accepted)
	v[2].integer(&a.Code)
	v[3].str(&a.Error, all)
	return exact, true
}
