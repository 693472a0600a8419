package tasks_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/worker/tasks"
)

func BenchmarkPrimeCount50M(b *testing.B) {
	reg := tasks.Builtins()
	payload := json.RawMessage(`{"limit":50000000}`)
	for b.Loop() {
		if res, err := reg.Run(context.Background(), tasks.TypePrimeCount, 1, payload); err != nil || res != "3001134" {
			b.Fatalf("Run = %q, %v", res, err)
		}
	}
}

func BenchmarkValidateMaxText(b *testing.B) {
	reg := tasks.Builtins()
	payload, _ := json.Marshal(map[string]string{"text": strings.Repeat("lorem ipsum ", 200_000/12)})
	for b.Loop() {
		if err := reg.Validate(tasks.TypeSHA256, payload); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRunSHA256 is a bench job's task: its payload read and its text hashed.
func BenchmarkRunSHA256(b *testing.B) {
	reg := tasks.Builtins()
	payload := json.RawMessage(`{"text":"job 12345 of the benchmark, a hundred bytes of text or so to hash, as bench submits"}`)
	for b.Loop() {
		if res, err := reg.Run(context.Background(), tasks.TypeSHA256, 1, payload); err != nil || len(res) != 64 {
			b.Fatalf("Run = %q, %v", res, err)
		}
	}
}
