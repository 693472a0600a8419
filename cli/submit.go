package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// taskFlag is the flag that fills the one payload field of a built-in task.
type taskFlag struct{ flag, field string }

var taskFlags = map[string]taskFlag{
	"SLEEP":       {"milliseconds", "durationMillis"},
	"WORD_COUNT":  {"text", "text"},
	"SHA256":      {"text", "text"},
	"PRIME_COUNT": {"limit", "limit"},
	"FAIL":        {"fail-until-attempt", "failUntilAttempt"},
}

// payloadFlags are the flags of taskFlags, each named once, in help order.
var payloadFlags = []string{"milliseconds", "text", "limit", "fail-until-attempt"}

// submitEnv names a flag describing the job: JOBBUS_SUBMIT_<FLAG>, so that --limit and
// --max-attempts do not share a variable with `jobs --limit` or the coordinator's
// --max-attempts.
func submitEnv(flag string) []string { return env("submit-" + flag) }

func jsonFlag() cli.Flag {
	return &cli.BoolFlag{Name: "json", Usage: "print one JSON object per line, for scripts", EnvVars: env("json")}
}

func timeoutFlag(usage string) cli.Flag {
	return &cli.DurationFlag{Name: "timeout", Usage: usage + " (0: until Ctrl-C)", EnvVars: env("timeout")}
}

// timeoutNeedsWait refuses --timeout without --wait on a command whose --timeout is how
// long --wait waits for what to end: unused, it would read as the job's own time limit.
// One set in the environment is shared configuration and stays quietly unused. Called
// once the flags after the arguments are read (args).
func timeoutNeedsWait(c *cli.Context, what string) error {
	if givenOnCommandLine(c, "timeout") && !c.Bool("wait") {
		return usageError("--timeout applies only with --wait: it is how long to wait for the %s to end", what)
	}
	return nil
}

func submitCommand() *cli.Command {
	return &cli.Command{
		Name:      "submit",
		Usage:     "submit a job",
		ArgsUsage: "TASK",
		Description: `Submits a job of TASK and prints its id. TASK is a built-in (SLEEP, WORD_COUNT, SHA256,
PRIME_COUNT or FAIL, any case, word-count for WORD_COUNT) or a task type a worker declared
(jobbus types lists them; text-reverse finds TEXT_REVERSE). The payload comes from the
task's flag (SLEEP --milliseconds, WORD_COUNT and SHA256 --text, PRIME_COUNT --limit, FAIL
--fail-until-attempt) or whole from --payload, which any task type takes; the coordinator
checks it against the type's JSON Schema.
An overloaded coordinator's rejection exits 3 (after --submit-retries retries).
With --wait it blocks until the job ends and exits 0 if it COMPLETED, 1 otherwise.

Examples:
   jobbus submit sha256 --text hello
   jobbus submit SLEEP --milliseconds 1500 --priority high --wait
   jobbus submit PRIME_COUNT --payload '{"limit":1000000}' --submit-retries 5 --json
   jobbus submit TEXT_REVERSE --payload '{"text":"hello"}' --wait
   jobbus submit sha256 --text later --in 10m
   jobbus submit sha256 --text merry --at 2026-12-24T09:00:00Z
   jobbus submit SLEEP --milliseconds 100 --queue low --key-concurrency customer-42
   jobbus submit sha256 --text done --after 0b7c2f0e-8a41-4d7e-9b43-3f6a1c2d9e10`,
		Flags: append([]cli.Flag{
			&cli.Int64Flag{Name: "milliseconds", Usage: "SLEEP: durationMillis, 0..600000", EnvVars: submitEnv("milliseconds")},
			&cli.StringFlag{Name: "text", Usage: "WORD_COUNT, SHA256: the text", EnvVars: submitEnv("text")},
			&cli.Int64Flag{Name: "limit", Usage: "PRIME_COUNT: count primes below this, 2..50000000", EnvVars: submitEnv("limit")},
			&cli.Int64Flag{Name: "fail-until-attempt", Usage: "FAIL: fail while the attempt is below this, 0..1000", EnvVars: submitEnv("fail-until-attempt")},
			&cli.StringFlag{Name: "payload", Usage: "the whole payload as a JSON object, instead of a task flag", EnvVars: submitEnv("payload")},
			&cli.IntFlag{Name: "max-attempts", Usage: "attempts before the job fails (0: the coordinator's default)", EnvVars: submitEnv("max-attempts")},
			&cli.StringFlag{Name: "priority", Usage: "high, normal or low (default normal)", EnvVars: submitEnv("priority")},
			&cli.StringFlag{Name: "idempotency-key", Usage: "submit at most once under this key: a repeat returns the first job's id", EnvVars: submitEnv("idempotency-key")},
			queueFlag(), keyConcurrencyFlag(), // queues.go
			&cli.DurationFlag{Name: "unique-for", Usage: "unique by task type and payload for this long (1h): a repeat within it returns this job's id, unless this job failed or was cancelled", EnvVars: submitEnv("unique-for")},
			&cli.StringFlag{Name: "unique-while", Usage: "active: unique by task type and payload while this job is active; a repeat returns its id", EnvVars: submitEnv("unique-while")},
			&cli.IntFlag{Name: "submit-retries", Usage: "retry an overload rejection this many times", EnvVars: env("submit-retries")},
			&cli.Int64Flag{Name: "submit-retry-base-millis", Value: 200, Usage: "first retry delay (full jitter, doubling)", EnvVars: env("submit-retry-base-millis")},
			&cli.Int64Flag{Name: "submit-retry-max-millis", Value: 5000, Usage: "longest retry delay", EnvVars: env("submit-retry-max-millis")},
			&cli.BoolFlag{Name: "wait", Usage: "wait until the job ends; exit 0 if it COMPLETED, 1 otherwise", EnvVars: env("wait")},
			timeoutFlag("with --wait, how long to wait"),
			jsonFlag(),
		}, append(laterFlags(), afterFlags()...)...), // later.go, workflow.go
		Action: submit,
	}
}

func submit(c *cli.Context) error {
	pos, err := args(c, "TASK")
	if err != nil {
		return err
	}
	if err := timeoutNeedsWait(c, "job"); err != nil {
		return err
	}
	task := taskName(pos[0])
	payload, err := buildPayload(c, task)
	if err != nil {
		return err
	}
	opts, err := submitOptions(c)
	if err != nil {
		return err
	}
	retry, err := submitRetries(c)
	if err != nil {
		return err
	}
	s, err := connect(c, false, retry)
	if err != nil {
		return exitErr(err)
	}
	defer s.Close()
	task = resolveTaskType(c.Context, s.cl, pos[0])
	id, err := s.cl.Submit(c.Context, task, payload, opts...)
	if err != nil {
		var se *client.ServerError
		if errors.As(err, &se) && strings.HasPrefix(se.Message, protocol.UnknownTaskType("").Message) {
			hint := "built-in tasks: " + strings.Join(taskNames(), ", ")
			others := knownTypes(c.Context, s.cl)
			if len(others) > 0 {
				hint += "; declared by workers: " + strings.Join(others, ", ")
			}
			var mean string
			if m := closestTask(task, append(taskNames(), others...)); m != "" {
				mean = ", did you mean " + m + "?"
			}
			err = fmt.Errorf("%w%s (%s)", err, mean, hint)
		}
		return exitErr(fmt.Errorf("submit %s: %w", task, afterFlagHint(err)))
	}
	p := newPrinter(c.App.Writer, c.Bool("json"))
	if !c.Bool("wait") {
		if p.json {
			return p.jsonLine(struct {
				JobID string `json:"jobId"`
			}{id})
		}
		_, err := fmt.Fprintln(p.w, id)
		return err
	}
	return waitAndShow(c, s, id)
}

// taskName is the wire name of the task the user typed: any case, and kebab-case for
// the built-ins' snake case (word-count is WORD_COUNT).
func taskName(s string) string { return protocol.TypedTaskType(s) }

// buildPayload is --payload, or the object holding the task's one flag; which of them
// the user gave is givenPayloadFlags.
func buildPayload(c *cli.Context, task string) (json.RawMessage, error) {
	tf, known := taskFlags[task]
	given := givenPayloadFlags(c, tf.flag)
	for _, name := range payloadFlags {
		switch {
		case !given[name]:
		case !known:
			return nil, usageError("--%s does not apply to %s, which is %s", name, task, notBuiltIn(task))
		case name != tf.flag:
			return nil, usageError("--%s does not apply to %s, which takes --%s (or the whole payload with --payload)", name, task, tf.flag)
		case given["payload"]:
			return nil, usageError("--%s and --payload cannot be combined: give %s either --%s or the whole payload with --payload", name, task, name)
		}
	}
	if given["payload"] {
		raw := json.RawMessage(c.String("payload"))
		if !json.Valid(raw) {
			return nil, usageError("--payload is not valid JSON: %s", c.String("payload"))
		}
		return raw, nil
	}
	if !known {
		return nil, usageError("%s is %s", task, notBuiltIn(task))
	}
	if !given[tf.flag] {
		return nil, usageError("%s needs --%s (or --payload JSON)", task, tf.flag)
	}
	var v any
	if tf.flag == "text" {
		v = c.String("text")
	} else {
		v = c.Int64(tf.flag)
	}
	return json.Marshal(map[string]any{tf.field: v})
}

// givenPayloadFlags is the set of payload flags (--payload and payloadFlags) that give
// the payload of a task whose own flag is own ("" when it is not built in): every one
// typed on the command line, and at most one set only in the environment. Such a flag
// (JOBBUS_SUBMIT_TEXT) is shared configuration, as a global flag's is: it counts only
// when neither own nor --payload was typed, own before --payload, and another task's
// flag set there never counts, so it is no mistake for that task.
func givenPayloadFlags(c *cli.Context, own string) map[string]bool {
	given := map[string]bool{"payload": givenOnCommandLine(c, "payload")}
	for _, name := range payloadFlags {
		given[name] = givenOnCommandLine(c, name)
	}
	if given["payload"] || given[own] {
		return given
	}
	switch {
	case own != "" && c.IsSet(own):
		given[own] = true
	case c.IsSet("payload"):
		given["payload"] = true
	}
	return given
}

// notBuiltIn says that task is none of the built-ins, and which one it may have meant.
func notBuiltIn(task string) string {
	names := strings.Join(taskNames(), ", ")
	if s := closestTask(task, taskNames()); s != "" {
		return fmt.Sprintf("not a built-in task: did you mean %s? (built-in tasks: %s; a task of your own takes --payload JSON)", s, names)
	}
	return fmt.Sprintf("not a built-in task (%s); a task of your own takes --payload JSON", names)
}

// closestTask is the task type among names that the user's typed name is closest to,
// compared as the command line reads names (any case, kebab-case), or "".
func closestTask(typed string, names []string) string {
	norm := make([]string, len(names))
	byNorm := make(map[string]string, len(names))
	for i, n := range names {
		norm[i] = taskName(n)
		byNorm[norm[i]] = n
	}
	if s := closest(taskName(typed), norm); s != "" && s != taskName(typed) {
		return byNorm[s]
	}
	return ""
}

func taskNames() []string {
	names := make([]string, 0, len(taskFlags))
	for n := range taskFlags {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func submitOptions(c *cli.Context) ([]client.SubmitOption, error) {
	opts, err := attemptsAndPriority(c)
	if err != nil {
		return nil, err
	}
	if c.IsSet("idempotency-key") {
		opts = append(opts, client.IdempotencyKey(c.String("idempotency-key")))
	}
	after, err := afterOptions(c) // workflow.go
	if err != nil {
		return nil, err
	}
	unique, err := uniqueOption(c) // limits.go
	if err != nil {
		return nil, err
	}
	later, err := laterOptions(c) // later.go
	if err != nil {
		return nil, err
	}
	return queueOptions(c, append(append(append(opts, after...), unique...), later...)) // queues.go
}

// attemptsAndPriority is --max-attempts and --priority as submit options: the job flags
// that submit and schedule add share.
func attemptsAndPriority(c *cli.Context) ([]client.SubmitOption, error) {
	n := c.Int("max-attempts")
	if n < 0 {
		return nil, usageError("--max-attempts must be 0 (the coordinator's default) or more, got %d", n)
	}
	opts := []client.SubmitOption{client.MaxAttempts(n)}
	if c.IsSet("priority") {
		p, err := parsePriority(c.String("priority"))
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.Priority(p))
	}
	return opts, nil
}

func parsePriority(s string) (protocol.Priority, error) {
	p, err := protocol.ParsePriority(s)
	if err != nil {
		return "", usageError("--priority must be high, normal or low, got %q", s)
	}
	return p, nil
}

// submitRetries is the client's answer to an overload rejection: --submit-retries
// retries with full jitter between the --submit-retry-* delays.
func submitRetries(c *cli.Context) (client.Option, error) {
	n := c.Int("submit-retries")
	base := time.Duration(c.Int64("submit-retry-base-millis")) * time.Millisecond
	max := time.Duration(c.Int64("submit-retry-max-millis")) * time.Millisecond
	switch {
	case n < 0:
		return nil, usageError("--submit-retries must be 0 or more, got %d", n)
	case base <= 0:
		return nil, usageError("--submit-retry-base-millis must be positive, got %d", c.Int64("submit-retry-base-millis"))
	case max < base:
		return nil, usageError("--submit-retry-max-millis (%d) must be at least --submit-retry-base-millis (%d)",
			c.Int64("submit-retry-max-millis"), c.Int64("submit-retry-base-millis"))
	}
	return client.WithSubmitRetries(n, base, max), nil
}
