package protocol_test

import (
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TestRequestJobIDStable pins the job ids request ids name: a submission sent again
// to a coordinator of another version must find the job the first send created, so
// the derivation never changes. The values are those of the first implementation
// (the SHA-256 of "jobbus request\x00" + rid), on both sides of MaxRequestID.
func TestRequestJobIDStable(t *testing.T) {
	cases := []struct{ rid, job string }{
		{"a", "e6116992-4f0b-8581-a608-cf0248ecc865"},
		{"0123456789abcdef0123456789abcdef", "0976c5fb-3565-8e74-9f0b-0d6de6fe5495"},
		{strings.Repeat("\x00", protocol.MaxRequestID), "44468386-9e3d-86c2-be33-0131626936c9"},
		{strings.Repeat("\x00", protocol.MaxRequestID+1), "456e6919-1fef-838b-abff-bbdeb4679c1b"},
	}
	for _, c := range cases {
		if got := protocol.RequestJobID(c.rid); got != c.job {
			t.Errorf("RequestJobID(%q) = %s, want %s", c.rid, got, c.job)
		}
	}
}

// TestRequestIDAllocations holds a fresh request id and its job id to the one
// allocation each that their strings need: they are made for every submission.
func TestRequestIDAllocations(t *testing.T) {
	rid := protocol.NewRequestID()
	if len(rid) != 32 || strings.Trim(rid, "0123456789abcdef") != "" {
		t.Fatalf("NewRequestID() = %q, want 32 hex digits", rid)
	}
	if raceOn {
		t.Skip("the race detector allocates besides the code under test")
	}
	if n := testing.AllocsPerRun(100, func() { _ = protocol.NewRequestID() }); n > 1 {
		t.Errorf("NewRequestID: %v allocations, want 1", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = protocol.RequestJobID(rid) }); n > 1 {
		t.Errorf("RequestJobID: %v allocations, want 1", n)
	}
}

// TestSubjectFor holds the subjects made once to Endpoints: each request type's
// subject is its endpoint's, both ways, and nothing else is one.
func TestSubjectFor(t *testing.T) {
	for _, e := range protocol.Endpoints {
		if got, ok := protocol.SubjectFor(e.Request); !ok || got != e.Subject() {
			t.Errorf("SubjectFor(%s) = %q, %v; want %q", e.Request, got, ok, e.Subject())
		}
		if got, ok := protocol.RequestOn(e.Subject()); !ok || got != e.Request {
			t.Errorf("RequestOn(%q) = %s, %v; want %s", e.Subject(), got, ok, e.Request)
		}
	}
	if s, ok := protocol.SubjectFor(protocol.TypeJobSubmitted); ok {
		t.Errorf("SubjectFor(JOB_SUBMITTED) = %q: not a request", s)
	}
	if typ, ok := protocol.RequestOn(protocol.APIPrefix + ".nothing"); ok {
		t.Errorf("RequestOn(an unknown subject) = %s", typ)
	}
}
