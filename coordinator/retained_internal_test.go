package coordinator

import (
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

func TestUUIDRoundTrip(t *testing.T) {
	t.Parallel()
	for range 100 {
		id := newID()
		u, ok := parseUUID(id)
		if !ok || u.String() != id {
			t.Fatalf("parseUUID(%q) = %v, %v; String() = %q", id, u, ok, u.String())
		}
	}
	// Ids in any other form would not read back as themselves: they are not parsed.
	for _, id := range []string{
		"", "job-1", "7F3C2A9E-5B1D-4C8E-9A0F-1E2D3C4B5A69", "7f3c2a9e5b1d4c8e9a0f1e2d3c4b5a69",
		"7f3c2a9e-5b1d-4c8e-9a0f-1e2d3c4b5a6", "7f3c2a9e-5b1d-4c8e-9a0f-1e2d3c4b5a690",
		"7f3c2a9e-5b1d-4c8e-9a0f_1e2d3c4b5a69", "7f3c2a9e-5b1d-4c8e-9a0f-1e2d3c4b5a6g",
		"7f3c2a9-e5b1d-4c8e-9a0f-1e2d3c4b5a69",
	} {
		if u, ok := parseUUID(id); ok {
			t.Errorf("parseUUID(%q) = %v, want no UUID", id, u)
		}
	}
}

// TestJobIndexKeepsEveryID: an entry gives back the id it was added with, whatever its
// form, and its key; removing it forgets both.
func TestJobIndexKeepsEveryID(t *testing.T) {
	t.Parallel()
	var x jobIndex
	canonical := newID()
	cases := []struct {
		seq uint64
		id  string
		st  protocol.State
		key string
	}{
		{1, canonical, protocol.StateCompleted, ""},
		{2, "job-2", protocol.StateFailed, "k2"},
		{3, strings.ToUpper(newID()), protocol.StateCancelled, ""},
		{4, newID(), protocol.StateQueued, ""},
		{5, "filled-00000005", protocol.StateCompleted, "k5"},
		{6, "0123456789abcdef", protocol.StateCompleted, ""},
	}
	for _, c := range cases {
		x.add(c.seq, c.id, c.st, c.key, nil)
	}
	for _, c := range cases {
		e := x.find(c.seq)
		if e == nil {
			t.Fatalf("find(%d) = nil", c.seq)
		}
		if got := x.id(e); got != c.id {
			t.Errorf("id of %d = %q, want %q", c.seq, got, c.id)
		}
		if got := string(x.appendID([]byte("x"), e)); got != "x"+c.id {
			t.Errorf("appendID of %d = %q, want %q", c.seq, got, "x"+c.id)
		}
		if !x.hasID(e, c.id) || x.hasID(e, c.id+"x") || x.hasID(e, canonical) != (c.id == canonical) {
			t.Errorf("hasID of %d disagrees with its id %q", c.seq, c.id)
		}
		if e.state() != c.st || x.key(e) != c.key {
			t.Errorf("entry %d: state %s key %q, want %s %q", c.seq, e.state(), x.key(e), c.st, c.key)
		}
	}
	x.remove(2)
	if x.find(2) != nil || len(x.odd) != 1 || len(x.keys) != 1 {
		t.Fatalf("after remove(2): find %v, odd ids %v, keys %v", x.find(2), x.odd, x.keys)
	}
	e := x.find(1)
	x.setKey(e, "k1")
	if x.key(e) != "k1" {
		t.Fatalf("key after setKey = %q", x.key(e))
	}
	x.setKey(e, "")
	if x.key(e) != "" || len(x.keys) != 1 {
		t.Fatalf("key after clearing = %q, keys %v", x.key(e), x.keys)
	}
}

// BenchmarkGCKeptJobs is a garbage collection with a million finished jobs kept in
// the index, ids made by newID as at run time: what a kept job costs the heap
// (heap-B/job, objects/job) and the collector (scan-B/job, the heap it scans).
func BenchmarkGCKeptJobs(b *testing.B) {
	const n = 1_000_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var x jobIndex
	for i := range n {
		x.add(uint64(i+1), newID(), protocol.StateCompleted, "", nil)
	}
	x.entries = slices.Clip(x.entries)
	runtime.GC()
	runtime.ReadMemStats(&after)
	scan := []metrics.Sample{{Name: "/gc/scan/heap:bytes"}}
	metrics.Read(scan)
	for b.Loop() {
		runtime.GC()
	}
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-B/job")
	b.ReportMetric(float64(after.HeapObjects-before.HeapObjects)/n, "objects/job")
	b.ReportMetric(float64(scan[0].Value.Uint64())/n, "scan-B/job")
	runtime.KeepAlive(&x)
}
