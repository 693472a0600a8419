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
)

// Names of the built-in task types.
const (
	TypeSleep      = "SLEEP"
	TypeWordCount  = "WORD_COUNT"
	TypeSHA256     = "SHA256"
	TypePrimeCount = "PRIME_COUNT"
	TypeFail       = "FAIL"
)

// Bounds of the built-in payloads (PROTOCOL.md, "Task payloads"). They exist
// so that no job can monopolise a worker.
const (
	maxSleepMillis      = 600_000
	maxTextChars        = 200_000
	minPrimeLimit       = 2
	maxPrimeLimit       = 50_000_000
	maxFailUntilAttempt = 1000
)

// builtin adapts a payload parser and a typed run function to Task. Run parses
// again rather than trusting its caller, so a worker handed a bad payload
// reports it instead of misbehaving.
type builtin[A any] struct {
	parse func(fields) (A, *PayloadError)
	run   func(ctx context.Context, attempt int, args A) (string, error)
}

func (b builtin[A]) args(payload json.RawMessage) (A, *PayloadError) {
	f, perr := parseObject(payload)
	if perr != nil {
		var zero A
		return zero, perr
	}
	return b.parse(f)
}

func (b builtin[A]) Validate(payload json.RawMessage) error {
	if _, perr := b.args(payload); perr != nil {
		return perr
	}
	return nil
}

func (b builtin[A]) Run(ctx context.Context, attempt int, payload json.RawMessage) (string, error) {
	a, perr := b.args(payload)
	if perr != nil {
		return "", perr
	}
	return b.run(ctx, attempt, a)
}

func builtinTasks() map[string]Task {
	return map[string]Task{
		TypeSleep: builtin[int64]{
			parse: func(f fields) (int64, *PayloadError) { return f.intField("durationMillis", 0, maxSleepMillis) },
			run:   runSleep,
		},
		TypeWordCount: builtin[string]{parse: textField, run: runWordCount},
		TypeSHA256:    builtin[string]{parse: textField, run: runSHA256},
		TypePrimeCount: builtin[int64]{
			parse: func(f fields) (int64, *PayloadError) { return f.intField("limit", minPrimeLimit, maxPrimeLimit) },
			run:   runPrimeCount,
		},
		TypeFail: builtin[int64]{
			parse: func(f fields) (int64, *PayloadError) {
				return f.intField("failUntilAttempt", 0, maxFailUntilAttempt)
			},
			run: runFail,
		},
	}
}

func textField(f fields) (string, *PayloadError) { return f.stringField("text", maxTextChars) }

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
