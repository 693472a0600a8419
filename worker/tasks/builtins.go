package tasks

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jobbus/jobbus/bus/protocol/tasktype"
	"github.com/jobbus/jobbus/internal/jobctx"
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
		TypeWordCount:  builtin[[]byte]{tasktype.WordCount, runWordCount},
		TypeSHA256:     builtin[[]byte]{tasktype.SHA256, runSHA256},
		TypePrimeCount: builtin[int64]{tasktype.PrimeCount, runPrimeCount},
		TypeFail:       builtin[int64]{tasktype.Fail, runFail},
	}
}

// runSleep waits on a timer rather than time.Sleep so that a cancel ends the
// attempt at once instead of after up to ten minutes. On a native worker, a sleep of
// at least sleepProgressFrom reports its progress every sleepProgressEvery.
func runSleep(ctx context.Context, _ int, millis int64) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	total := time.Duration(millis) * time.Millisecond
	t := time.NewTimer(total)
	defer t.Stop()
	var tick <-chan time.Time
	if total >= sleepProgressFrom && jobctx.Reporting(ctx) {
		tk := time.NewTicker(sleepProgressEvery)
		defer tk.Stop()
		tick = tk.C
		jobctx.Progress(ctx, 0, fmt.Sprintf("slept 0 of %d ms", millis))
	}
	start := time.Now()
	for {
		select {
		case <-t.C:
			if tick != nil { // a short sleep reports nothing: a record write saved
				jobctx.Progress(ctx, 1, fmt.Sprintf("slept %d of %d ms", millis, millis))
			}
			return fmt.Sprintf("slept %d ms", millis), nil
		case now := <-tick:
			slept := min(now.Sub(start), total)
			jobctx.Progress(ctx, float64(slept)/float64(total), fmt.Sprintf("slept %d of %d ms", slept.Milliseconds(), millis))
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// A SLEEP reports progress when it lasts at least sleepProgressFrom, every
// sleepProgressEvery (the worker coalesces reports further).
const (
	sleepProgressFrom  = 500 * time.Millisecond
	sleepProgressEvery = 100 * time.Millisecond
)

func runWordCount(_ context.Context, _ int, text []byte) (string, error) {
	return strconv.Itoa(len(bytes.Fields(text))), nil
}

func runSHA256(_ context.Context, _ int, text []byte) (string, error) {
	sum := sha256.Sum256(text)
	// Encoded into an array, so that only the result string is allocated
	// (hex.EncodeToString allocates its buffer too, of a size it cannot know).
	var digits [2 * sha256.Size]byte
	hex.Encode(digits[:], sum[:])
	return string(digits[:]), nil
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
