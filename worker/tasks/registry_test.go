package tasks_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jobbus/jobbus/worker/tasks"
)

// upper is a custom task type, as a user's worker.Handle would add one.
type upper struct{}

func (upper) Validate(p json.RawMessage) error {
	var s string
	if json.Unmarshal(p, &s) != nil {
		return &tasks.PayloadError{Message: "Payload must be a JSON string"}
	}
	return nil
}

func (upper) Run(_ context.Context, _ int, p json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(p, &s); err != nil {
		return "", err
	}
	return strings.ToUpper(s), nil
}

func TestRegistry(t *testing.T) {
	t.Parallel()
	builtinNames := []string{"FAIL", "PRIME_COUNT", "SHA256", "SLEEP", "WORD_COUNT"}

	t.Run("BuiltinsHasTheFiveSorted", func(t *testing.T) {
		t.Parallel()
		if got := tasks.Builtins().Names(); !slices.Equal(got, builtinNames) {
			t.Fatalf("Names = %v, want %v", got, builtinNames)
		}
		for _, name := range builtinNames {
			if task, ok := tasks.Builtins().Lookup(name); !ok || task == nil {
				t.Errorf("Lookup(%s) = %v, %v", name, task, ok)
			}
		}
	})

	t.Run("UnknownTaskType", func(t *testing.T) {
		t.Parallel()
		reg := tasks.Builtins()
		want := "unknown task type 'sleep' (known: FAIL, PRIME_COUNT, SHA256, SLEEP, WORD_COUNT)"
		if _, ok := reg.Lookup("sleep"); ok {
			t.Error("Lookup is case-insensitive, want exact")
		}
		err := reg.Validate("sleep", json.RawMessage(`{"durationMillis":1}`))
		if !errors.Is(err, tasks.ErrUnknownTask) || err.Error() != want {
			t.Errorf("Validate = %v, want %q", err, want)
		}
		_, err = reg.Run(context.Background(), "sleep", 1, json.RawMessage(`{"durationMillis":1}`))
		if !errors.Is(err, tasks.ErrUnknownTask) || err.Error() != want {
			t.Errorf("Run = %v, want %q", err, want)
		}
		var perr *tasks.PayloadError
		if errors.As(err, &perr) {
			t.Error("unknown task type is also a PayloadError")
		}
	})

	t.Run("RegisterCustomTask", func(t *testing.T) {
		t.Parallel()
		reg := tasks.Builtins()
		if err := reg.Register("UPPER", upper{}); err != nil {
			t.Fatalf("Register: %v", err)
		}
		if got := reg.Names(); !slices.Equal(got, []string{"FAIL", "PRIME_COUNT", "SHA256", "SLEEP", "UPPER", "WORD_COUNT"}) {
			t.Errorf("Names = %v", got)
		}
		if err := reg.Validate("UPPER", json.RawMessage(`5`)); err == nil {
			t.Error("Validate(5) = nil, want the custom task's error")
		}
		if got, err := reg.Run(context.Background(), "UPPER", 1, json.RawMessage(`"abc"`)); err != nil || got != "ABC" {
			t.Errorf("Run = %q, %v; want ABC", got, err)
		}
		if slices.Contains(tasks.Builtins().Names(), "UPPER") {
			t.Error("Builtins registries share state")
		}
	})

	t.Run("RegisterRejects", func(t *testing.T) {
		t.Parallel()
		reg := tasks.Builtins()
		if err := reg.Register("SLEEP", upper{}); !errors.Is(err, tasks.ErrDuplicateTask) {
			t.Errorf("Register(SLEEP) = %v, want ErrDuplicateTask", err)
		}
		if err := reg.Register("", upper{}); err == nil {
			t.Error("Register(\"\") = nil")
		}
		if err := reg.Register("NIL", nil); err == nil {
			t.Error("Register(nil) = nil")
		}
		if got := reg.Names(); !slices.Equal(got, builtinNames) {
			t.Errorf("rejected registrations changed Names: %v", got)
		}
		if got, _ := reg.Run(context.Background(), "SLEEP", 1, json.RawMessage(`{"durationMillis":0}`)); got != "slept 0 ms" {
			t.Errorf("SLEEP replaced: Run = %q", got)
		}
	})

	t.Run("NewRegistryIsEmpty", func(t *testing.T) {
		t.Parallel()
		reg := tasks.NewRegistry()
		if len(reg.Names()) != 0 {
			t.Errorf("Names = %v", reg.Names())
		}
		if err := reg.Validate("SLEEP", nil); err == nil || err.Error() != "unknown task type 'SLEEP' (known: )" {
			t.Errorf("Validate = %v", err)
		}
	})

	t.Run("ConcurrentUse", func(t *testing.T) {
		t.Parallel()
		reg := tasks.Builtins()
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				if err := reg.Register(fmt.Sprintf("CUSTOM_%d", i), upper{}); err != nil {
					t.Error(err)
				}
			})
			wg.Go(func() {
				if got, err := reg.Run(context.Background(), "WORD_COUNT", 1, json.RawMessage(`{"text":"a b"}`)); err != nil || got != "2" {
					t.Errorf("Run = %q, %v", got, err)
				}
				_ = reg.Names()
			})
		}
		wg.Wait()
		if n := len(reg.Names()); n != 13 {
			t.Errorf("len(Names) = %d, want 13", n)
		}
	})
}
