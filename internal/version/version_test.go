package version

import "testing"

func TestNormalize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"1.2.3", "1.2.3"},
		{"v1.2.3", "1.2.3"},
		{"v0.0.0-20261130155733-6cb5704abcde+dirty", "0.0.0-20261130155733-6cb5704abcde+dirty"},
		{"v1.3.0-rc.1", "1.3.0-rc.1"},
		{"", Dev},
		{"(devel)", Dev},
		{"nightly", "0.0.0-nightly"},
		{"my build/7", "0.0.0-my-build-7"},
		{"1.2", "0.0.0-1.2"},
	} {
		if got := normalize(tc.in); got != tc.want {
			t.Errorf("normalize(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if got := normalize(tc.in); !semver.MatchString(got) {
			t.Errorf("normalize(%q) = %q is not semantic versioning", tc.in, got)
		}
	}
}

func TestStringIsSemver(t *testing.T) {
	t.Parallel()
	if v := String(); !semver.MatchString(v) {
		t.Fatalf("String() = %q is not semantic versioning", v)
	}
}
