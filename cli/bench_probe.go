package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jobbus/jobbus/worker/tasks"
)

// benchTask is the task type bench submits; its payload's text names the job's number
// ("bench-<n>") so that the in-process workers can tell when each job started.
const benchTask = "SHA256"

const benchTextPrefix = "bench-"

// benchPayload is job n's payload, {"text":"bench-<n>"}, encoded as the peers'
// benchmarks pass theirs: bytes made once, which the client sends as they are.
func benchPayload(n int) json.RawMessage {
	b := make([]byte, 0, 32)
	b = append(b, `{"text":"`+benchTextPrefix...)
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, `"}`...)
}

// startProbe records when each bench job first started to run on an in-process worker,
// by job number, as River's and Asynq's benchmarks record their handler starts.
type startProbe struct {
	at []atomic.Int64 // unix nanoseconds; 0 until started
}

func newStartProbe(jobs int) *startProbe { return &startProbe{at: make([]atomic.Int64, jobs)} }

func (p *startProbe) started(n int) time.Time {
	if p == nil || n < 0 || n >= len(p.at) {
		return time.Time{}
	}
	ns := p.at[n].Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// tasks returns the built-in tasks with the bench task wrapped to record its starts.
func (p *startProbe) tasks() *tasks.Registry {
	builtins := tasks.Builtins()
	reg := tasks.NewRegistry()
	for _, name := range builtins.Names() {
		t, _ := builtins.Lookup(name)
		if name == benchTask {
			t = probedTask{Task: t, probe: p}
		}
		_ = reg.Register(name, t) // names are unique and non-empty
	}
	return reg
}

type probedTask struct {
	tasks.Task
	probe *startProbe
}

func (t probedTask) Run(ctx context.Context, attempt int, payload json.RawMessage) (string, error) {
	if n, ok := benchJobNumber(payload); ok && n < len(t.probe.at) {
		t.probe.at[n].CompareAndSwap(0, time.Now().UnixNano())
	}
	return t.Task.Run(ctx, attempt, payload)
}

// custom runs benchCustomType's work, noting its start as the wrapped SHA256 does.
func (p *startProbe) custom(ctx context.Context, attempt int, a benchArgs) (string, error) {
	if n, ok := benchJobNumber([]byte(a.Text)); ok && p != nil && n < len(p.at) {
		p.at[n].CompareAndSwap(0, time.Now().UnixNano())
	}
	return benchSHA256(ctx, attempt, a)
}

// benchJobNumber reads n from a payload {"text":"bench-<n>"} without decoding it.
func benchJobNumber(payload []byte) (int, bool) {
	i := bytes.Index(payload, []byte(benchTextPrefix))
	if i < 0 {
		return 0, false
	}
	digits := payload[i+len(benchTextPrefix):]
	end := 0
	for end < len(digits) && end < 10 && digits[end] >= '0' && digits[end] <= '9' {
		end++
	}
	n, err := strconv.Atoi(string(digits[:end]))
	return n, err == nil
}
