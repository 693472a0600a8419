package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	fuzzFunc   = regexp.MustCompile(`(?m)^func (Fuzz\w+)\(`)
	fuzzTarget = regexp.MustCompile(`(?m)^\s*"(Fuzz\w+) (\./[\w/]*)"`)
)

// TestCIFuzzesEveryTarget: .ci/fuzz names every fuzz target in the repository, in its
// package, so a new decoder's target is fuzzed in CI and not only replayed from its
// seeds.
func TestCIFuzzesEveryTarget(t *testing.T) {
	script, err := os.ReadFile(".ci/fuzz")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, m := range fuzzTarget.FindAllStringSubmatch(string(script), -1) {
		listed[m[1]+" "+strings.TrimSuffix(m[2], "/")] = true
	}
	found := 0
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range fuzzFunc.FindAllStringSubmatch(string(src), -1) {
			found++
			if target := m[1] + " ./" + filepath.ToSlash(filepath.Dir(path)); !listed[target] {
				t.Errorf(".ci/fuzz does not run %s (%s)", target, path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 || len(listed) == 0 {
		t.Fatalf("found %d fuzz targets and %d in .ci/fuzz: the patterns no longer match", found, len(listed))
	}
}
