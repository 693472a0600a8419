// Package version is jobbus's one version: what `jobbus version`, `jobbus --version`
// and the micro service's INFO report.
//
// A release build sets it with the linker:
//
//	go build -ldflags "-X github.com/jobbus/jobbus/internal/version.version=1.2.0" .
//
// Without that, it is the module version the Go toolchain stamped into the binary
// (`go install github.com/jobbus/jobbus@v1.2.0` gives 1.2.0; a build from a git clone
// gives a pseudo-version naming the commit), and 0.0.0-dev when there is none.
package version

import (
	"regexp"
	"runtime/debug"
	"strings"
)

// Module is jobbus's module path, under which the build info records its version when
// another program links jobbus as a library.
const Module = "github.com/jobbus/jobbus"

// version is set with -ldflags "-X"; empty means "ask the build info".
var version string

// Dev is the version of a build that carries none.
const Dev = "0.0.0-dev"

// semver is the Semantic Versioning 2.0 grammar that nats.go's micro requires of a
// service version.
var semver = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// String is the version, as semantic versioning without the Go "v" prefix, so that the
// micro service accepts it and every place prints the same text.
func String() string {
	v := version
	if v == "" {
		v = fromBuildInfo()
	}
	return normalize(v)
}

// fromBuildInfo reads the version the toolchain stamped: the main module's when jobbus
// is the program, else the version of the jobbus dependency.
func fromBuildInfo() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	if bi.Main.Path == Module {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == Module {
			if d.Replace != nil {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	return ""
}

// normalize drops the "v" prefix and turns anything that is not semantic versioning
// ("(devel)", "", a bare name) into a pre-release of 0.0.0.
func normalize(v string) string {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	if semver.MatchString(v) {
		return v
	}
	if v == "" || v == "(devel)" {
		return Dev
	}
	clean := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, v)
	clean = strings.Trim(strings.ReplaceAll(clean, "..", "."), ".")
	if s := "0.0.0-" + clean; semver.MatchString(s) {
		return s
	}
	return Dev
}
