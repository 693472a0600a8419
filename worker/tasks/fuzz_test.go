package tasks_test

import (
	"context"
	"encoding/hex"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/worker/tasks"
)

var (
	failText    = regexp.MustCompile(`^deliberate failure on attempt 1 \(failing until ([0-9]+)\)$`)
	payloadText = regexp.MustCompile(`^(Payload must be a JSON object|Field '[A-Za-z]+' (must be an integer|must be a string|exceeds 200000 characters|must be in \[-?[0-9]+, [0-9]+\], got -?[0-9]+))$`)
)

// FuzzValidate feeds arbitrary task types and payloads (they come off the
// network in SUBMIT_JOB) to Validate. Validate must not panic, must reject with
// one of the documented texts, and must agree with Run: an accepted payload
// never makes Run report a payload error, and a rejected one fails Run alike.
func FuzzValidate(f *testing.F) {
	reg := tasks.Builtins()
	f.Fuzz(func(t *testing.T, taskType string, payload []byte) {
		err := reg.Validate(taskType, payload)
		var perr *tasks.PayloadError
		switch {
		case err == nil:
		case errors.Is(err, tasks.ErrUnknownTask):
			return
		case errors.As(err, &perr):
			if !payloadText.MatchString(perr.Message) {
				t.Fatalf("undocumented payload error %q", perr.Message)
			}
		default:
			t.Fatalf("Validate = %v (%T), want nil, unknown task or *PayloadError", err, err)
		}

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if taskType == tasks.TypeSleep {
			cancel() // SLEEP may be ten minutes long: check it stops cleanly.
		}
		res, runErr := reg.Run(ctx, taskType, 1, payload)
		if perr != nil {
			if runErr == nil || runErr.Error() != perr.Error() {
				t.Fatalf("Validate = %v but Run = %q, %v", perr, res, runErr)
			}
			return
		}
		checkRun(t, taskType, res, runErr)
	})
}

func checkRun(t *testing.T, taskType, res string, err error) {
	t.Helper()
	switch {
	case taskType == tasks.TypeSleep:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("SLEEP with a cancelled context = %q, %v", res, err)
		}
	case taskType == tasks.TypeFail && err != nil:
		if m := failText.FindStringSubmatch(err.Error()); m == nil || m[1] == "0" || m[1] == "1" {
			t.Fatalf("FAIL error %q", err)
		}
	case err != nil:
		t.Fatalf("%s: Run after a valid payload = %v", taskType, err)
	case taskType == tasks.TypeSHA256:
		if b, derr := hex.DecodeString(res); derr != nil || len(b) != 32 || strings.ToLower(res) != res {
			t.Fatalf("SHA256 result %q", res)
		}
	case taskType == tasks.TypeFail:
		if res != "succeeded on attempt 1" {
			t.Fatalf("FAIL result %q", res)
		}
	default: // WORD_COUNT and PRIME_COUNT give a decimal count
		if n, cerr := strconv.Atoi(res); cerr != nil || n < 0 || strconv.Itoa(n) != res {
			t.Fatalf("%s result %q", taskType, res)
		}
	}
}
