package protocol_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

func TestParseRate(t *testing.T) {
	t.Parallel()
	good := []struct {
		in     string
		count  int64
		period time.Duration
		str    string
	}{
		{"100/s", 100, time.Second, "100/s"},
		{"100/m", 100, time.Minute, "100/m"},
		{" 5 / H ", 5, time.Hour, "5/h"},
		{"1000/d", 1000, 24 * time.Hour, "1000/d"},
		{"3/minute", 3, time.Minute, "3/m"},
		{"2/sec", 2, time.Second, "2/s"},
		{"10/30s", 10, 30 * time.Second, "10/30s"},
		{"1/1m30s", 1, 90 * time.Second, "1/1m30s"},
		{"1/ms", 1, time.Millisecond, "1/ms"},
		{"1000000/s", 1_000_000, time.Second, "1000000/s"},
	}
	for _, c := range good {
		r, err := protocol.ParseRate(c.in)
		if err != nil {
			t.Errorf("ParseRate(%q): %v", c.in, err)
			continue
		}
		if r.Count != c.count || r.Period != c.period {
			t.Errorf("ParseRate(%q) = %d per %v, want %d per %v", c.in, r.Count, r.Period, c.count, c.period)
		}
		if r.String() != c.str {
			t.Errorf("ParseRate(%q).String() = %q, want %q", c.in, r.String(), c.str)
		}
		if back, err := protocol.ParseRate(r.String()); err != nil || back != r {
			t.Errorf("ParseRate(%q) does not read its own String %q back: %v, %v", c.in, r.String(), back, err)
		}
	}
	bad := []struct{ in, says string }{
		{"", "must be COUNT/PERIOD"},
		{"100", "must be COUNT/PERIOD"},
		{"0/s", "must be positive, got 0"},
		{"-5/m", "must be positive, got -5"},
		{"1.5/s", "is not an integer"},
		{"ten/s", "is not an integer"},
		{"100/fortnight", `unknown unit "fortnight"`},
		{"100/", `unknown unit ""`},
		{"100/5x", "neither a unit"},
		{"1/0s", "between 1ms and 24h0m0s, got 0s"},
		{"1/48h", "between 1ms and 24h0m0s, got 48h0m0s"},
		{"1/1us", "between 1ms"},
		{"1000001/s", "at most 1000000"},
	}
	for _, c := range bad {
		_, err := protocol.ParseRate(c.in)
		if err == nil {
			t.Errorf("ParseRate(%q) accepted it", c.in)
			continue
		}
		if !errors.Is(err, protocol.ErrBadLimit) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("ParseRate(%q) = %v, want ErrBadLimit saying %q", c.in, err, c.says)
		}
	}
}
