package tasktype_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol/tasktype"
)

type validateCase struct {
	name     string
	taskType string
	payload  string // "<absent>" stands for a nil payload
	want     string // PayloadError.Message, or "" for valid
}

func intFieldCases(taskType, field string, lo, hi int64) []validateCase {
	notInt := fmt.Sprintf("Field '%s' must be an integer", field)
	rangeErr := func(n int64) string {
		return fmt.Sprintf("Field '%s' must be in [%d, %d], got %d", field, lo, hi, n)
	}
	obj := func(v string) string { return fmt.Sprintf(`{%q:%s}`, field, v) }
	return []validateCase{
		{"Missing", taskType, `{}`, notInt},
		{"OtherFieldOnly", taskType, `{"other":5}`, notInt},
		{"WrongCase", taskType, fmt.Sprintf(`{%q:%d}`, strings.ToUpper(field), lo), notInt},
		{"Null", taskType, obj(`null`), notInt},
		{"String", taskType, obj(`"5"`), notInt},
		{"Fraction", taskType, obj(`1.5`), notInt},
		{"WholeFloat", taskType, obj(`1.0`), notInt},
		{"Exponent", taskType, obj(`1e3`), notInt},
		{"UpperExponent", taskType, obj(`1E3`), notInt},
		{"Bool", taskType, obj(`true`), notInt},
		{"Array", taskType, obj(`[5]`), notInt},
		{"Object", taskType, obj(`{"n":5}`), notInt},
		{"BeyondInt64", taskType, obj(`9223372036854775808`), notInt},
		{"BelowInt64", taskType, obj(`-9223372036854775809`), notInt},
		{"MaxInt64", taskType, obj(`9223372036854775807`), rangeErr(9223372036854775807)},
		{"BelowMin", taskType, obj(fmt.Sprint(lo - 1)), rangeErr(lo - 1)},
		{"AboveMax", taskType, obj(fmt.Sprint(hi + 1)), rangeErr(hi + 1)},
		{"Negative", taskType, obj(`-5`), rangeErr(-5)},
		{"Min", taskType, obj(fmt.Sprint(lo)), ""},
		{"Max", taskType, obj(fmt.Sprint(hi)), ""},
		{"SpacedAndExtraFields", taskType, fmt.Sprintf(` { "x" : [1.5] , %q : %d , "y":null } `, field, lo), ""},
		{"DuplicateKeyLastWins", taskType, fmt.Sprintf(`{%q:"x",%q:%d}`, field, field, lo), ""},
	}
}

func textFieldCases(taskType string) []validateCase {
	const notString = "Field 'text' must be a string"
	const tooLong = "Field 'text' exceeds 200000 characters"
	text := func(s string) string {
		b, _ := json.Marshal(map[string]string{"text": s})
		return string(b)
	}
	return []validateCase{
		{"Missing", taskType, `{}`, notString},
		{"Null", taskType, `{"text":null}`, notString},
		{"Number", taskType, `{"text":5}`, notString},
		{"Bool", taskType, `{"text":false}`, notString},
		{"Array", taskType, `{"text":["a"]}`, notString},
		{"Object", taskType, `{"text":{}}`, notString},
		{"Empty", taskType, `{"text":""}`, ""},
		{"ExtraFields", taskType, `{"text":"a b","limit":"x","more":[1,2]}`, ""},
		{"AtLimitASCII", taskType, text(strings.Repeat("a", 200_000)), ""},
		{"OverLimitASCII", taskType, text(strings.Repeat("a", 200_001)), tooLong},
		// Two UTF-8 bytes but one UTF-16 unit each: 400 000 bytes is still fine.
		{"AtLimitTwoByteRunes", taskType, text(strings.Repeat("é", 200_000)), ""},
		// Escapes count once decoded: 200 000 characters, 1.2 MB of JSON.
		{"AtLimitEscaped", taskType, `{"text":"` + strings.Repeat(`\u00e9`, 200_000) + `"}`, ""},
		// Outside the BMP each character is two UTF-16 units, as in Java.
		{"AtLimitSurrogatePairs", taskType, text(strings.Repeat("😀", 100_000)), ""},
		{"OverLimitSurrogatePairs", taskType, text(strings.Repeat("😀", 100_000) + "a"), tooLong},
	}
}

func notObjectCases(taskType string) []validateCase {
	const notObject = "Payload must be a JSON object"
	var cases []validateCase
	for name, p := range map[string]string{
		"Absent": "<absent>", "Empty": "", "Blank": " \n\t", "Null": "null", "Array": `[{"text":"a"}]`,
		"String": `"{}"`, "Number": "5", "Bool": "true", "Malformed": `{"text":`, "TrailingGarbage": `{} x`,
		"NotJSON": "hello",
	} {
		cases = append(cases, validateCase{"NotObject" + name, taskType, p, notObject})
	}
	return cases
}

func allValidateCases() []validateCase {
	var all []validateCase
	add := func(taskType string, cs []validateCase) {
		for _, c := range append(cs, notObjectCases(taskType)...) {
			c.name = taskType + "/" + c.name
			all = append(all, c)
		}
	}
	add(tasktype.Sleep.Name, intFieldCases(tasktype.Sleep.Name, "durationMillis", 0, 600_000))
	add(tasktype.PrimeCount.Name, intFieldCases(tasktype.PrimeCount.Name, "limit", 2, 50_000_000))
	add(tasktype.Fail.Name, intFieldCases(tasktype.Fail.Name, "failUntilAttempt", 0, 1000))
	add(tasktype.WordCount.Name, textFieldCases(tasktype.WordCount.Name))
	add(tasktype.SHA256.Name, textFieldCases(tasktype.SHA256.Name))
	return append(all,
		validateCase{"SLEEP/NegativeZero", tasktype.Sleep.Name, `{"durationMillis":-0}`, ""},
		validateCase{"SLEEP/ExampleOutOfRange", tasktype.Sleep.Name, `{"durationMillis":700000}`,
			"Field 'durationMillis' must be in [0, 600000], got 700000"},
		validateCase{"PRIME_COUNT/ExampleTooSmall", tasktype.PrimeCount.Name, `{"limit":1}`,
			"Field 'limit' must be in [2, 50000000], got 1"},
	)
}

func TestValidate(t *testing.T) {
	t.Parallel()
	reg := tasktype.Builtins()
	for _, tc := range allValidateCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var payload json.RawMessage
			if tc.payload != "<absent>" {
				payload = json.RawMessage(tc.payload)
			}
			err := reg.Validate(tc.taskType, payload)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate(%.80s) = %v, want nil", tc.payload, err)
				}
				return
			}
			var perr *tasktype.PayloadError
			if !errors.As(err, &perr) {
				t.Fatalf("Validate(%.80s) = %v, want *PayloadError", tc.payload, err)
			}
			if perr.Message != tc.want {
				t.Errorf("Message = %q, want %q", perr.Message, tc.want)
			}
			if got, want := err.Error(), "Invalid payload: "+tc.want; got != want {
				t.Errorf("Error() = %q, want %q", got, want)
			}
		})
	}
}
