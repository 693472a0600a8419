package cli

import "testing"

func TestParseSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"", 0, false}, {"0", 0, false}, {"1048576", 1 << 20, false}, {"512M", 512 << 20, false},
		{"512mb", 512 << 20, false}, {"10GiB", 10 << 30, false}, {"1 T", 1 << 40, false}, {"64k", 64 << 10, false},
		{"100B", 100, false}, {"-1", 0, true}, {"1.5G", 0, true}, {"G", 0, true}, {"lots", 0, true}, {"99999999999T", 0, true},
	} {
		got, err := parseSize(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d (error %v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
}
