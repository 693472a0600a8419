package tasks_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobbus/jobbus/worker/tasks"
)

func TestRunResults(t *testing.T) {
	t.Parallel()
	reg := tasks.Builtins()
	for _, tc := range []struct {
		name, taskType, payload, want string
	}{
		{"SleepZero", tasks.TypeSleep, `{"durationMillis":0}`, "slept 0 ms"},
		{"SleepShort", tasks.TypeSleep, `{"durationMillis":5}`, "slept 5 ms"},
		{"WordCountEmpty", tasks.TypeWordCount, `{"text":""}`, "0"},
		{"WordCountBlank", tasks.TypeWordCount, `{"text":" \t\n "}`, "0"},
		{"WordCountOne", tasks.TypeWordCount, `{"text":"hello"}`, "1"},
		{"WordCountMixedSpace", tasks.TypeWordCount, `{"text":"  the quick\tbrown\n\nfox  "}`, "4"},
		{"WordCountUnicodeSpace", tasks.TypeWordCount, `{"text":"a\u00a0b\u3000c"}`, "3"},
		{"SHA256Empty", tasks.TypeSHA256, `{"text":""}`, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"SHA256ABC", tasks.TypeSHA256, `{"text":"abc"}`, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		// UTF-8 bytes of "é" are c3 a9; escaped and literal forms hash alike.
		{"SHA256UTF8", tasks.TypeSHA256, `{"text":"\u00e9"}`, "4a99557e4033c3539de2eb65472017cad5f9557f7a0625a09f1c3f6e2ba69c4c"},
		{"PrimesBelow2", tasks.TypePrimeCount, `{"limit":2}`, "0"},
		{"PrimesBelow3", tasks.TypePrimeCount, `{"limit":3}`, "1"},
		{"PrimesBelow4", tasks.TypePrimeCount, `{"limit":4}`, "2"},
		{"PrimesBelow10", tasks.TypePrimeCount, `{"limit":10}`, "4"},
		{"PrimesBelow11", tasks.TypePrimeCount, `{"limit":11}`, "4"},
		{"PrimesBelow12", tasks.TypePrimeCount, `{"limit":12}`, "5"},
		{"PrimesBelow100", tasks.TypePrimeCount, `{"limit":100}`, "25"},
		{"PrimesBelow65537", tasks.TypePrimeCount, `{"limit":65537}`, "6542"},
		{"PrimesBelow65538", tasks.TypePrimeCount, `{"limit":65538}`, "6543"},
		{"PrimesBelowMillion", tasks.TypePrimeCount, `{"limit":1000000}`, "78498"},
		{"PrimesBelow50M", tasks.TypePrimeCount, `{"limit":50000000}`, "3001134"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := reg.Run(context.Background(), tc.taskType, 1, json.RawMessage(tc.payload))
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if got != tc.want {
				t.Errorf("Run = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestPrimeCountMatchesTrialDivision checks every limit up to a few segment
// boundaries' worth against a naive count.
func TestPrimeCountMatchesTrialDivision(t *testing.T) {
	t.Parallel()
	reg := tasks.Builtins()
	isPrime := func(n int) bool {
		if n < 2 {
			return false
		}
		for d := 2; d*d <= n; d++ {
			if n%d == 0 {
				return false
			}
		}
		return true
	}
	want := 0
	for limit := 2; limit <= 3000; limit++ {
		if isPrime(limit - 1) {
			want++
		}
		payload, _ := json.Marshal(map[string]int{"limit": limit})
		got, err := reg.Run(context.Background(), tasks.TypePrimeCount, 1, payload)
		if err != nil || got != itoa(want) {
			t.Fatalf("limit %d: Run = %q, %v; want %d", limit, got, err, want)
		}
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestFailAttempts(t *testing.T) {
	t.Parallel()
	reg := tasks.Builtins()
	for _, tc := range []struct {
		name      string
		failUntil string
		attempt   int
		want      string
		wantErr   string
	}{
		{"ZeroNeverFails", "0", 1, "succeeded on attempt 1", ""},
		{"OneNeverFails", "1", 1, "succeeded on attempt 1", ""},
		{"FailsBeforeN", "3", 1, "", "deliberate failure on attempt 1 (failing until 3)"},
		{"FailsJustBeforeN", "3", 2, "", "deliberate failure on attempt 2 (failing until 3)"},
		{"SucceedsAtN", "3", 3, "succeeded on attempt 3", ""},
		{"SucceedsAfterN", "3", 7, "succeeded on attempt 7", ""},
		{"MaxBound", "1000", 999, "", "deliberate failure on attempt 999 (failing until 1000)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := reg.Run(context.Background(), tasks.TypeFail, tc.attempt,
				json.RawMessage(`{"failUntilAttempt":`+tc.failUntil+`}`))
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr || got != "" {
					t.Fatalf("Run = %q, %v; want error %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Run = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// runAsync runs a task in a goroutine and waits for it with a generous
// deadline: the assertion is that it ends, not how fast.
func runAsync(t *testing.T, ctx context.Context, taskType, payload string) (string, error) {
	t.Helper()
	type outcome struct {
		res string
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := tasks.Builtins().Run(ctx, taskType, 1, json.RawMessage(payload))
		done <- outcome{res, err}
	}()
	select {
	case o := <-done:
		return o.res, o.err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s %s did not end after cancel", taskType, payload)
		return "", nil
	}
}

func TestCancellation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, taskType, payload string }{
		{"Sleep30s", tasks.TypeSleep, `{"durationMillis":30000}`},
		{"SleepMax", tasks.TypeSleep, `{"durationMillis":600000}`},
		{"PrimeCount50M", tasks.TypePrimeCount, `{"limit":50000000}`},
	} {
		t.Run(tc.name+"/CancelledWhileRunning", func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			// Cancel from elsewhere while Run is (or is about to be) running.
			time.AfterFunc(20*time.Millisecond, cancel)
			start := time.Now()
			res, err := runAsync(t, ctx, tc.taskType, tc.payload)
			if tc.taskType == tasks.TypePrimeCount && err == nil {
				t.Skipf("sieve finished (%q) before the cancel arrived", res)
			}
			if !errors.Is(err, context.Canceled) || res != "" {
				t.Fatalf("Run = %q, %v; want context.Canceled", res, err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("Run took %v after a 20 ms cancel", d)
			}
		})
		t.Run(tc.name+"/AlreadyCancelled", func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if res, err := runAsync(t, ctx, tc.taskType, tc.payload); !errors.Is(err, context.Canceled) || res != "" {
				t.Fatalf("Run = %q, %v; want context.Canceled", res, err)
			}
		})
	}
}

// cancelAfterPolls is a real context that cancels itself once it has been
// polled n times, so a test can cancel deterministically in mid-computation.
type cancelAfterPolls struct {
	context.Context
	cancel context.CancelFunc
	left   atomic.Int64
}

func newCancelAfterPolls(n int64) *cancelAfterPolls {
	ctx, cancel := context.WithCancel(context.Background())
	c := &cancelAfterPolls{Context: ctx, cancel: cancel}
	c.left.Store(n)
	return c
}

func (c *cancelAfterPolls) poll() {
	if c.left.Add(-1) < 0 {
		c.cancel()
	}
}

func (c *cancelAfterPolls) Err() error            { c.poll(); return c.Context.Err() }
func (c *cancelAfterPolls) Done() <-chan struct{} { c.poll(); return c.Context.Done() }

func TestPrimeCountChecksContextWhileSieving(t *testing.T) {
	t.Parallel()
	ctx := newCancelAfterPolls(10) // well into the ~760 segments of 50M
	res, err := tasks.Builtins().Run(ctx, tasks.TypePrimeCount, 1, json.RawMessage(`{"limit":50000000}`))
	if !errors.Is(err, context.Canceled) || res != "" {
		t.Fatalf("Run = %q, %v; want context.Canceled", res, err)
	}
	if polls := 10 - ctx.left.Load(); polls > 12 {
		t.Errorf("context polled %d times, want the sieve to stop at the first poll after cancel", polls)
	}
}

func TestRunRejectsInvalidPayload(t *testing.T) {
	t.Parallel()
	reg := tasks.Builtins()
	for _, name := range reg.Names() {
		_, err := reg.Run(context.Background(), name, 1, json.RawMessage(`[]`))
		var perr *tasks.PayloadError
		if !errors.As(err, &perr) || perr.Message != "Payload must be a JSON object" {
			t.Errorf("%s: Run([]) = %v, want PayloadError", name, err)
		}
	}
	_, err := reg.Run(context.Background(), tasks.TypeSleep, 1, json.RawMessage(`{"durationMillis":1.5}`))
	if err == nil || !strings.Contains(err.Error(), "must be an integer") {
		t.Errorf("Run(SLEEP 1.5) = %v, want integer error", err)
	}
}
