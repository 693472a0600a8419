package tasks

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jobbus/jobbus/bus/protocol/tasktype"
)

// Names of the built-in task types.
const (
	TypeSleep      = tasktype.TypeSleep
	TypeWordCount  = tasktype.TypeWordCount
	TypeSHA256     = tasktype.TypeSHA256
	TypePrimeCount = tasktype.TypePrimeCount
	TypeFail       = tasktype.TypeFail
)

// builtin pairs a built-in task type's contract with the code that runs it. Run parses
// the payload again rather than trusting its caller, so a worker handed a bad payload
// reports it instead of misbehaving.
type builtin[A any] struct {
	def tasktype.Builtin[A]
	run func(ctx context.Context, attempt int, args A) (string, error)
}

func (b builtin[A]) Validate(payload json.RawMessage) error { return b.def.Validate(payload) }

func (b builtin[A]) Run(ctx context.Context, attempt int, payload json.RawMessage) (string, error) {
	a, err := b.def.Args(payload)
	if err != nil {
		return "", err
	}
	return b.run(ctx, attempt, a)
}

func builtinTasks() map[string]Task {
	return map[string]Task{
		TypeSleep:      builtin[int64]{tasktype.Sleep, runSleep},
		TypeWordCount:  builtin[string]{tasktype.WordCount, runWordCount},
		TypeSHA256:     builtin[string]{tasktype.SHA256, runSHA256},
		TypePrimeCount: builtin[int64]{tasktype.PrimeCount, runPrimeCount},
		TypeFail:       builtin[int64]{tasktype.Fail, runFail},
	}
}

// runSleep waits on a timer rather than time.Sleep so that a cancel ends the
// attempt at once instead of after up to ten minutes.
func runSleep(ctx context.Context, _ int, millis int64) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	t := time.NewTimer(time.Duration(millis) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return fmt.Sprintf("slept %d ms", millis), nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func runWordCount(_ context.Context, _ int, text string) (string, error) {
	return strconv.Itoa(len(strings.Fields(text))), nil
}

func runSHA256(_ context.Context, _ int, text string) (string, error) {
	sum := sha256.Sum256([]byte(text))
	return hex.EncodeToString(sum[:]), nil
}

func runPrimeCount(ctx context.Context, _ int, limit int64) (string, error) {
	n, err := countPrimesBelow(ctx, int(limit))
	if err != nil {
		return "", err
	}
	return strconv.Itoa(n), nil
}

func runFail(_ context.Context, attempt int, failUntil int64) (string, error) {
	if int64(attempt) < failUntil {
		return "", fmt.Errorf("deliberate failure on attempt %d (failing until %d)", attempt, failUntil)
	}
	return fmt.Sprintf("succeeded on attempt %d", attempt), nil
}
