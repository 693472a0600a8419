package worker_test

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// preRelease matches a module version with a pre-release or pseudo-version suffix
// (v4.0.0-rc.2, v0.0.0-20240521201337-686a1a2994c1): code its authors have not released.
var preRelease = regexp.MustCompile(`^v\d+\.\d+\.\d+-`)

// TestLinksNoPreRelease: a program that imports worker (to serve task types of its
// own) links only released modules, so `go get github.com/jobbus/jobbus/worker` never
// pulls a release candidate into a user's build. invopop/jsonschema's ordered map
// once brought go.yaml.in/yaml/v4 v4.0.0-rc.2; go.mod now asks for the release.
func TestLinksNoPreRelease(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list the package's dependencies")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{with .Module}}{{.Path}} {{.Version}}{{end}}",
		"github.com/jobbus/jobbus/worker").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, version, _ := strings.Cut(line, " ")
		if line == "" || path == "github.com/jobbus/jobbus" || seen[line] {
			continue
		}
		seen[line] = true
		if preRelease.MatchString(version) {
			t.Errorf("worker links %s %s, a pre-release", path, version)
		}
	}
	if len(seen) == 0 {
		t.Fatalf("go list named no module the worker links:\n%s", out)
	}
}
