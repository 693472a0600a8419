package protocol_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

// FuzzDecode feeds the decoder arbitrary frames. It must never panic, must report
// every failure as ErrMalformed, and whatever it accepts must survive Encode: the
// re-encoding decodes to the same message and re-encodes to the same bytes.
// DecodeExact must agree with Decode, and what it calls exact Encode must write back
// byte for byte (checkExact). The seed corpus is in testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		checkExact(t, data)
		m, err := protocol.Decode(data)
		if err != nil {
			if m != nil {
				t.Fatalf("Decode returned %#v with error %v", m, err)
			}
			if !errors.Is(err, protocol.ErrMalformed) {
				t.Fatalf("error %q does not wrap ErrMalformed", err)
			}
			return
		}
		if typ, err := protocol.PeekType(data); err != nil || typ != m.MessageType() {
			t.Fatalf("PeekType = %q, %v; Decode gave a %s", typ, err, m.MessageType())
		}
		first, err := protocol.Encode(m)
		if err != nil {
			t.Fatalf("Encode(%#v): %v", m, err)
		}
		again, err := protocol.Decode(first)
		if err != nil {
			t.Fatalf("Decode of our own encoding %s: %v", first, err)
		}
		if !reflect.DeepEqual(semantic(t, m), semantic(t, again)) {
			t.Fatalf("round trip changed the message\ninput %q\n  was %#v\n  now %#v", data, m, again)
		}
		second, err := protocol.Encode(again)
		if err != nil {
			t.Fatalf("Encode(%#v): %v", again, err)
		}
		if !bytes.Equal(first, second) {
			t.Fatalf("encoding is not stable\n first %s\nsecond %s", first, second)
		}
	})
}

// semantic returns a copy of m in which the differences Encode may legitimately make
// are erased: payloads and schemas are compared as JSON values (Encode compacts them
// and escapes HTML), a nil list equals an empty one (Encode writes nil as []), and a
// batched submission without "submit" equals one whose submit is null (Encode writes
// it so; the coordinator answers either as a malformed request).
func semantic(t *testing.T, m protocol.Message) protocol.Message {
	t.Helper()
	switch m := m.(type) {
	case *protocol.TaskAssign:
		c := *m
		c.Payload = canonicalJSON(t, c.Payload)
		return &c
	case *protocol.SubmitJob:
		c := *m
		c.Payload = canonicalJSON(t, c.Payload)
		return &c
	case *protocol.SubmitJobs:
		c := *m
		c.Jobs = slices.Clone(c.Jobs)
		for i := range c.Jobs {
			if c.Jobs[i].Submit == nil {
				c.Jobs[i].Submit = json.RawMessage("null")
			}
			c.Jobs[i].Submit = canonicalJSON(t, c.Jobs[i].Submit)
		}
		return &c
	case *protocol.JobsSubmitted:
		c := *m
		c.Answers = slices.Clone(c.Answers)
		for i := range c.Answers {
			c.Answers[i] = canonicalJSON(t, c.Answers[i])
		}
		return &c
	case *protocol.JobList:
		c := *m
		if c.Jobs == nil {
			c.Jobs = []protocol.Job{}
		}
		return &c
	case *protocol.WorkerList:
		c := *m
		if c.Workers == nil {
			c.Workers = []protocol.Worker{}
		}
		return &c
	case *protocol.WorkerRegister:
		c := *m
		c.TaskTypes = slices.Clone(c.TaskTypes)
		for i := range c.TaskTypes {
			c.TaskTypes[i].Schema = canonicalJSON(t, c.TaskTypes[i].Schema)
		}
		return &c
	case *protocol.TaskTypeList:
		c := *m
		c.TaskTypes = append([]protocol.TaskTypeInfo{}, c.TaskTypes...) // nil as []
		for i := range c.TaskTypes {
			c.TaskTypes[i].Schema = canonicalJSON(t, c.TaskTypes[i].Schema)
		}
		return &c
	}
	return m
}

func canonicalJSON(t *testing.T, raw json.RawMessage) json.RawMessage {
	t.Helper()
	if raw == nil {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("payload %q is not JSON: %v", raw, err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("payload %q: %v", raw, err)
	}
	return out
}
