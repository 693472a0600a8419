package bridge

import (
	"errors"
	"testing"
	"time"
)

// TestDeadlineArmsLazily: arm sets the deadline a full timeout ahead, leaves it while
// more than nine tenths of the timeout is left, and sets it again once it expired or a
// setting failed; whatever happens, the deadline lies within (d*9/10, d] ahead.
func TestDeadlineArmsLazily(t *testing.T) {
	const d = time.Hour // no tenth of it passes during the test
	var set []time.Time
	fail := false
	record := func(at time.Time) error {
		if fail {
			return errors.New("closed")
		}
		set = append(set, at)
		return nil
	}
	within := func(step string) {
		t.Helper()
		left := time.Until(set[len(set)-1])
		if left <= d-d/10 || left > d {
			t.Fatalf("%s: deadline %v ahead, want within (%v, %v]", step, left, d-d/10, d)
		}
	}
	var dl deadline
	before := time.Now()
	if err := dl.arm(record, d); err != nil || len(set) != 1 || set[0].Before(before.Add(d)) {
		t.Fatalf("first arm: %v, set %v", err, set)
	}
	within("first arm")
	for range 100 {
		if err := dl.arm(record, d); err != nil {
			t.Fatal(err)
		}
	}
	if len(set) != 1 {
		t.Fatalf("arm set the deadline %d times within a tenth of it, want once", len(set))
	}
	// A shorter timeout than the deadline set: moved, never left beyond it.
	if err := dl.arm(record, d/2); err != nil || len(set) != 2 || time.Until(set[1]) > d/2 {
		t.Fatalf("arm with a shorter timeout: %v, set %v", err, set)
	}
	dl.expired()
	if err := dl.arm(record, d); err != nil || len(set) != 3 {
		t.Fatalf("arm after expired: %v, %d settings, want 3", err, len(set))
	}
	within("after expired")
	fail = true
	dl.expired()
	if err := dl.arm(record, d); err == nil {
		t.Fatal("arm reported no error from a failed setting")
	}
	fail = false
	if err := dl.arm(record, d); err != nil || len(set) != 4 {
		t.Fatalf("arm after a failed setting: %v, %d settings, want 4", err, len(set))
	}
	within("after a failed setting")
}
