package tasktype_test

import (
	"encoding/json"
	"errors"
	"regexp"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol/tasktype"
)

// payloadText is every reason a built-in task type may give (PROTOCOL.md's texts).
var payloadText = regexp.MustCompile(`^(Payload must be a JSON object|Field '[A-Za-z]+' (must be an integer|must be a string|exceeds 200000 characters|must be in \[-?[0-9]+, [0-9]+\], got -?[0-9]+))$`)

// FuzzValidatePayload feeds the coordinator's payload validation what a SUBMIT_JOB
// may carry off the network. It must not panic; it accepts, or rejects with one of
// the documented texts; and it accepts only a JSON object, since encoding/json must
// then read the payload as one. Unlike worker/tasks' FuzzValidate it runs no task, so
// it reaches a million inputs in minutes. Seeds (deep nesting, invalid UTF-8, NUL
// bytes, numbers as strings, exponents, integers beyond 2^63, duplicate keys) are in
// testdata/fuzz/FuzzValidatePayload.
func FuzzValidatePayload(f *testing.F) {
	set := tasktype.Builtins()
	for _, name := range set.Names() {
		f.Add(name, []byte(`{}`))
	}
	f.Fuzz(func(t *testing.T, taskType string, payload []byte) {
		err := set.Validate(taskType, payload)
		var perr *tasktype.PayloadError
		switch {
		case err == nil:
			var obj map[string]json.RawMessage
			if json.Unmarshal(payload, &obj) != nil || obj == nil {
				t.Fatalf("%s accepted %q, which is not a JSON object", taskType, payload)
			}
		case errors.Is(err, tasktype.ErrUnknown):
		case errors.As(err, &perr):
			if !payloadText.MatchString(perr.Message) {
				t.Fatalf("undocumented payload error %q for %q", perr.Message, payload)
			}
		default:
			t.Fatalf("Validate = %v (%T), want nil, ErrUnknown or *PayloadError", err, err)
		}
		if again := set.Validate(taskType, payload); (again == nil) != (err == nil) || (err != nil && again.Error() != err.Error()) {
			t.Fatalf("Validate is not deterministic: %v then %v", err, again)
		}
	})
}
