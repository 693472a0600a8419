package protocol_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

func ptr[T any](v T) *T { return &v }

// runningJob and finishedJob are full snapshots: one with a worker, one without.
func runningJob() protocol.Job {
	return protocol.Job{
		JobID: "job-1", TaskType: "SLEEP", State: protocol.StateRunning,
		Attempts: 1, MaxAttempts: 3, WorkerID: ptr("worker-1"),
		CreatedAtMillis: 1700000000000, UpdatedAtMillis: 1700000000100,
		Priority: protocol.PriorityHigh,
	}
}

func finishedJob() protocol.Job {
	return protocol.Job{
		JobID: "job-2", TaskType: "FAIL", State: protocol.StateCompleted,
		Attempts: 2, MaxAttempts: 3, Result: ptr("ok"), Error: ptr("attempt 1 failed"),
		CreatedAtMillis: 1700000000000, UpdatedAtMillis: 1700000000900,
		Priority: protocol.PriorityLow,
	}
}

// roundTripCases holds every message type, with optional pointers both nil and set.
// Payloads are compact because Encode compacts json.RawMessage.
var roundTripCases = []struct {
	name string
	msg  protocol.Message
}{
	{"WorkerRegister", &protocol.WorkerRegister{WorkerID: "worker-1", Capacity: 4}},
	{"WorkerRegisterWithTaskTypes", &protocol.WorkerRegister{WorkerID: "w", Capacity: 1024, TaskTypes: []protocol.TaskTypeDecl{protocol.Named("SLEEP"), {Name: "RESIZE_IMAGE", Schema: json.RawMessage(`{"type":"object"}`), Options: protocol.TaskTypeOptions{Concurrency: 2}, Declared: true}}}},
	{"WorkerRegisterWithNoTaskTypes", &protocol.WorkerRegister{WorkerID: "w", Capacity: 1, TaskTypes: []protocol.TaskTypeDecl{}}},
	{"WorkerRegistered", &protocol.WorkerRegistered{WorkerID: "worker-1"}},
	{"Heartbeat", &protocol.Heartbeat{WorkerID: "worker-1"}},
	{"TaskAssign", &protocol.TaskAssign{JobID: "j", AttemptID: "a", AttemptNumber: 2, TaskType: "SLEEP", Payload: json.RawMessage(`{"durationMillis":10}`)}},
	{"TaskAssignNilPayload", &protocol.TaskAssign{JobID: "j", AttemptID: "a", AttemptNumber: 1, TaskType: "SLEEP"}},
	{"TaskCancel", &protocol.TaskCancel{JobID: "j", AttemptID: "a"}},
	{"TaskResultSuccess", &protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Success: true, Result: ptr("42")}},
	{"TaskResultFailure", &protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Error: ptr("boom")}},
	{"TaskResultBothSet", &protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Result: ptr(""), Error: ptr("")}},
	{"TaskResultBothNil", &protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a"}},
	{"Error", &protocol.Error{Message: "First message must be WORKER_REGISTER"}},
	{"SubmitJobMinimal", &protocol.SubmitJob{TaskType: "WORD_COUNT", Payload: json.RawMessage(`{"text":"a b"}`)}},
	{"SubmitJobFull", &protocol.SubmitJob{TaskType: "PRIME_COUNT", Payload: json.RawMessage(`{"limit":100}`), MaxAttempts: 5, IdempotencyKey: ptr("key-1"), Priority: ptr(protocol.PriorityHigh)}},
	{"SubmitJobLowPriority", &protocol.SubmitJob{TaskType: "SLEEP", Payload: json.RawMessage(`{"durationMillis":0}`), MaxAttempts: -1, Priority: ptr(protocol.PriorityLow)}},
	{"SubmitJobNormalPriority", &protocol.SubmitJob{TaskType: "SLEEP", Payload: json.RawMessage(`{"durationMillis":0}`), Priority: ptr(protocol.PriorityNormal)}},
	{"SubmitJobNilPayload", &protocol.SubmitJob{TaskType: "SLEEP", IdempotencyKey: ptr("")}},
	{"JobSubmitted", &protocol.JobSubmitted{JobID: "job-1"}},
	{"TaskResultPermanent", &protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Error: ptr("bad input"), Permanent: true}},
	{"TaskResultSnooze", &protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Error: ptr("snoozed for 5s"), SnoozeMillis: 5000}},
	{"ListTaskTypes", &protocol.ListTaskTypes{}},
	{"TaskTypeList", &protocol.TaskTypeList{TaskTypes: []protocol.TaskTypeInfo{
		{Name: "SHA256", Builtin: true, Workers: []string{"w1"}, Queued: 1},
		{Name: "TEXT_REVERSE", Schema: json.RawMessage(`{"type":"object"}`), Options: protocol.TaskTypeOptions{MaxAttempts: 2, TimeoutMillis: 100, Concurrency: 3}, Workers: []string{}, Running: 2, LastServedMillis: 1700000000000},
	}}},
	{"SubmitRejected", &protocol.SubmitRejected{Reason: "too many active jobs", ActiveCount: 100, Limit: 100, Retryable: true}},
	{"GetJobStatus", &protocol.GetJobStatus{JobID: "job-1"}},
	{"JobStatusRunning", &protocol.JobStatus{Job: runningJob()}},
	{"JobStatusFinished", &protocol.JobStatus{Job: finishedJob()}},
	{"ListJobs", &protocol.ListJobs{}},
	{"ListJobsWithExtensions", &protocol.ListJobs{Limit: 10, State: ptr(protocol.StateRetryWait), Cursor: "c-1"}},
	{"JobListEmpty", &protocol.JobList{Jobs: []protocol.Job{}}},
	{"JobList", &protocol.JobList{Jobs: []protocol.Job{runningJob(), finishedJob()}, NextCursor: "c-2"}},
	{"ListWorkers", &protocol.ListWorkers{}},
	{"WorkerListEmpty", &protocol.WorkerList{Workers: []protocol.Worker{}}},
	{"WorkerList", &protocol.WorkerList{Workers: []protocol.Worker{
		{WorkerID: "a", Capacity: 2, ActiveTasks: 1, LastHeartbeatMillis: 1700000000000},
		{WorkerID: "b", Capacity: 1024},
	}}},
	{"CancelJob", &protocol.CancelJob{JobID: "job-1"}},
	{"JobCancelCancelled", &protocol.JobCancel{Cancelled: true, Job: protocol.Job{JobID: "j", TaskType: "SLEEP", State: protocol.StateCancelled, Priority: protocol.PriorityNormal}}},
	{"JobCancelAlreadyTerminal", &protocol.JobCancel{Job: finishedJob()}},
	{"AddScheduleEvery", &protocol.AddSchedule{Schedule: protocol.ScheduleSpec{Name: "tick", EveryMillis: 30000, TaskType: "SLEEP", Payload: json.RawMessage(`{"durationMillis":1}`)}}},
	{"AddScheduleCron", &protocol.AddSchedule{Schedule: protocol.ScheduleSpec{Name: "nightly", Cron: "0 0 3 * * *", TimeZone: "Europe/Berlin", CatchUp: protocol.CatchUpAll,
		TaskType: "SHA256", Payload: json.RawMessage(`{"text":"x"}`), MaxAttempts: 2, Priority: ptr(protocol.PriorityHigh)}}},
	{"ListSchedules", &protocol.ListSchedules{}},
	{"PauseSchedule", &protocol.PauseSchedule{Name: "tick"}},
	{"ResumeSchedule", &protocol.ResumeSchedule{Name: "tick"}},
	{"RemoveSchedule", &protocol.RemoveSchedule{Name: "tick"}},
	{"TriggerSchedule", &protocol.TriggerSchedule{Name: "tick"}},
	{"ScheduleInfo", &protocol.ScheduleInfo{Schedule: protocol.Schedule{ScheduleSpec: protocol.ScheduleSpec{Name: "tick", EveryMillis: 1000, TaskType: "SLEEP", Payload: json.RawMessage(`{}`)},
		Paused: true, CreatedAtMillis: 1, SinceMillis: 2, LastTickMillis: 3, LastJobID: "j", LastRunMillis: 4, LastError: "Unknown task type: X", LastErrorMillis: 5, Failures: 6, NextTickMillis: 7}}},
	{"ScheduleListEmpty", &protocol.ScheduleList{Schedules: []protocol.Schedule{}}},
	{"WorkerRegisterWithQueues", &protocol.WorkerRegister{WorkerID: "w", Capacity: 2, Queues: []protocol.QueueWeight{{Name: "critical", Weight: 6}, {Name: "default", Weight: 1}}, StrictQueues: true}},
	{"ListQueues", &protocol.ListQueues{}},
	{"QueueList", &protocol.QueueList{Queues: []protocol.QueueInfo{
		{Name: "default", Queued: 3, Running: 1, Keys: 1, Workers: 2, Started: 10, StartedPerMinute: 4, LatencyMillis: 250},
		{Name: "low", QueueSettings: protocol.QueueSettings{Paused: true, MaxRunning: 20, KeyConcurrency: 2}, Throttled: 7},
	}}},
	{"PauseQueue", &protocol.PauseQueue{Queue: "low"}},
	{"ResumeQueue", &protocol.ResumeQueue{Queue: "low"}},
	{"SetQueue", &protocol.SetQueue{Queue: "low", MaxRunning: ptr(20), KeyConcurrency: ptr(0)}},
	{"SetQueueNothing", &protocol.SetQueue{Queue: "low"}},
	{"QueueUpdated", &protocol.QueueUpdated{Queue: protocol.QueueInfo{Name: "low", QueueSettings: protocol.QueueSettings{Paused: true}}}},
	{"SetLimit", &protocol.SetLimit{Scope: "type", Name: "SEND_EMAIL", Rate: "100/m", Burst: 10}},
	{"SetLimitNoBurst", &protocol.SetLimit{Scope: "queue", Name: "low", Rate: "5/s"}},
	{"RemoveLimit", &protocol.RemoveLimit{Scope: "queue", Name: "low"}},
	{"ListLimits", &protocol.ListLimits{}},
	{"LimitListEmpty", &protocol.LimitList{Limits: []protocol.LimitInfo{}}},
	{"LimitList", &protocol.LimitList{Limits: []protocol.LimitInfo{
		{Scope: "type", Name: "SEND_EMAIL", Rate: "100/m", Burst: 10, PerSecond: 100.0 / 60, Tokens: 2.5, Throttled: 7, NextTokenMillis: 1700000000000},
	}}},
	{"LimitRemoved", &protocol.LimitRemoved{Limit: protocol.LimitInfo{Scope: "queue", Name: "low", Rate: "5/s", Burst: 1, PerSecond: 5, Tokens: 1}}},
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range roundTripCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			data, err := protocol.Encode(tc.msg)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			got, err := protocol.Decode(data)
			if err != nil {
				t.Fatalf("Decode(%s): %v", data, err)
			}
			if !reflect.DeepEqual(got, tc.msg) {
				t.Fatalf("round trip of %s\n got %#v\nwant %#v", data, got, tc.msg)
			}
		})
	}
}

func TestRoundTripCoversEveryMessageType(t *testing.T) {
	t.Parallel()
	covered := map[protocol.Type]bool{}
	for _, tc := range roundTripCases {
		covered[tc.msg.MessageType()] = true
	}
	known := protocol.KnownTypes()
	// PROTOCOL.md's 18, the task type catalogue's two, workflows' eight, schedules'
	// eight, the queues' six, the rate limits' five and the batch of submissions' two
	// (native extensions).
	if len(known) != 49 {
		t.Errorf("Decode knows %d message types, PROTOCOL.md has 18 and jobbus adds 31: %v", len(known), known)
	}
	for _, typ := range known {
		if !covered[typ] {
			t.Errorf("no round-trip case for %s", typ)
		}
	}
}

func TestEncodeWritesTypeFirst(t *testing.T) {
	t.Parallel()
	for _, tc := range roundTripCases {
		data, err := protocol.Encode(tc.msg)
		if err != nil {
			t.Fatalf("%s: Encode: %v", tc.name, err)
		}
		prefix := `{"type":"` + string(tc.msg.MessageType()) + `"`
		if !bytes.HasPrefix(data, []byte(prefix)) || (data[len(prefix)] != ',' && data[len(prefix)] != '}') {
			t.Errorf("%s: encoding does not start with %s: %s", tc.name, prefix, data)
		}
		if !json.Valid(data) {
			t.Errorf("%s: encoding is not valid JSON: %s", tc.name, data)
		}
	}
}

func TestEncodeGolden(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		msg  protocol.Message
		want string
	}{
		{"Heartbeat", protocol.Heartbeat{WorkerID: "worker-1"},
			`{"type":"HEARTBEAT","workerId":"worker-1"}`},
		{"HeartbeatPointer", &protocol.Heartbeat{WorkerID: "worker-1"},
			`{"type":"HEARTBEAT","workerId":"worker-1"}`},
		{"WorkerRegisterFromSpecPeer", protocol.WorkerRegister{WorkerID: "worker-1", Capacity: 4},
			`{"type":"WORKER_REGISTER","workerId":"worker-1","capacity":4}`},
		{"WorkerRegisterWithNoTaskTypes", protocol.WorkerRegister{WorkerID: "w", Capacity: 1, TaskTypes: []protocol.TaskTypeDecl{}},
			`{"type":"WORKER_REGISTER","workerId":"w","capacity":1,"taskTypes":[]}`},
		{"TaskAssign", protocol.TaskAssign{JobID: "j1", AttemptID: "a1", AttemptNumber: 1, TaskType: "SLEEP", Payload: json.RawMessage(`{"durationMillis":5}`)},
			`{"type":"TASK_ASSIGN","jobId":"j1","attemptId":"a1","attemptNumber":1,"taskType":"SLEEP","payload":{"durationMillis":5}}`},
		{"TaskAssignNilPayload", protocol.TaskAssign{JobID: "j1", AttemptID: "a1", AttemptNumber: 1, TaskType: "SLEEP"},
			`{"type":"TASK_ASSIGN","jobId":"j1","attemptId":"a1","attemptNumber":1,"taskType":"SLEEP","payload":null}`},
		{"TaskResultNullResult", protocol.TaskResult{WorkerID: "worker-1", JobID: "j1", AttemptID: "a1", Success: false, Error: ptr("boom")},
			`{"type":"TASK_RESULT","workerId":"worker-1","jobId":"j1","attemptId":"a1","success":false,"result":null,"error":"boom"}`},
		{"TaskResultSuccess", protocol.TaskResult{WorkerID: "worker-1", JobID: "j1", AttemptID: "a1", Success: true, Result: ptr("3")},
			`{"type":"TASK_RESULT","workerId":"worker-1","jobId":"j1","attemptId":"a1","success":true,"result":"3","error":null}`},
		{"Error", protocol.Error{Message: "Unknown job: j9"},
			`{"type":"ERROR","message":"Unknown job: j9"}`},
		{"SubmitJobFromSpecPeer", protocol.SubmitJob{TaskType: "SLEEP", Payload: json.RawMessage(`{"durationMillis":5}`)},
			`{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"durationMillis":5},"maxAttempts":0,"idempotencyKey":null,"priority":null}`},
		{"SubmitJobFull", protocol.SubmitJob{TaskType: "SLEEP", Payload: json.RawMessage(`{"durationMillis":5}`), MaxAttempts: 3, IdempotencyKey: ptr("k"), Priority: ptr(protocol.PriorityLow)},
			`{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"durationMillis":5},"maxAttempts":3,"idempotencyKey":"k","priority":"LOW"}`},
		{"SubmitRejected", protocol.SubmitRejected{Reason: "Coordinator is at its active job limit", ActiveCount: 10, Limit: 10, Retryable: true},
			`{"type":"SUBMIT_REJECTED","reason":"Coordinator is at its active job limit","activeCount":10,"limit":10,"retryable":true}`},
		{"JobStatusWorkerNull", protocol.JobStatus{Job: finishedJob()},
			`{"type":"JOB_STATUS","job":{"jobId":"job-2","taskType":"FAIL","state":"COMPLETED","attempts":2,"maxAttempts":3,"workerId":null,"result":"ok","error":"attempt 1 failed","createdAtMillis":1700000000000,"updatedAtMillis":1700000000900,"priority":"LOW"}}`},
		{"JobStatusRunning", protocol.JobStatus{Job: runningJob()},
			`{"type":"JOB_STATUS","job":{"jobId":"job-1","taskType":"SLEEP","state":"RUNNING","attempts":1,"maxAttempts":3,"workerId":"worker-1","result":null,"error":null,"createdAtMillis":1700000000000,"updatedAtMillis":1700000000100,"priority":"HIGH"}}`},
		{"JobStatusUnsetPriorityIsNormal", protocol.JobStatus{Job: protocol.Job{JobID: "j", TaskType: "SLEEP", State: protocol.StateQueued, MaxAttempts: 3}},
			`{"type":"JOB_STATUS","job":{"jobId":"j","taskType":"SLEEP","state":"QUEUED","attempts":0,"maxAttempts":3,"workerId":null,"result":null,"error":null,"createdAtMillis":0,"updatedAtMillis":0,"priority":"NORMAL"}}`},
		{"JobListNil", protocol.JobList{},
			`{"type":"JOB_LIST","jobs":[]}`},
		{"JobListEmpty", protocol.JobList{Jobs: []protocol.Job{}},
			`{"type":"JOB_LIST","jobs":[]}`},
		{"JobListWithCursor", protocol.JobList{Jobs: []protocol.Job{{JobID: "j", TaskType: "SLEEP", State: protocol.StateFailed, Priority: protocol.PriorityNormal}}, NextCursor: "c"},
			`{"type":"JOB_LIST","jobs":[{"jobId":"j","taskType":"SLEEP","state":"FAILED","attempts":0,"maxAttempts":0,"workerId":null,"result":null,"error":null,"createdAtMillis":0,"updatedAtMillis":0,"priority":"NORMAL"}],"nextCursor":"c"}`},
		{"ListWorkers", protocol.ListWorkers{},
			`{"type":"LIST_WORKERS"}`},
		{"WorkerListNil", protocol.WorkerList{},
			`{"type":"WORKER_LIST","workers":[]}`},
		{"WorkerList", protocol.WorkerList{Workers: []protocol.Worker{{WorkerID: "w", Capacity: 2, ActiveTasks: 1, LastHeartbeatMillis: 5}}},
			`{"type":"WORKER_LIST","workers":[{"workerId":"w","capacity":2,"activeTasks":1,"lastHeartbeatMillis":5}]}`},
		{"ListJobsFromSpecPeer", protocol.ListJobs{},
			`{"type":"LIST_JOBS"}`},
		{"ListJobsWithExtensions", protocol.ListJobs{Limit: 50, State: ptr(protocol.StateQueued), Cursor: "c"},
			`{"type":"LIST_JOBS","limit":50,"state":"QUEUED","cursor":"c"}`},
		{"CancelJob", protocol.CancelJob{JobID: "j1"},
			`{"type":"CANCEL_JOB","jobId":"j1"}`},
		{"JobCancel", protocol.JobCancel{Cancelled: false, Job: finishedJob()},
			`{"type":"JOB_CANCEL","cancelled":false,"job":{"jobId":"job-2","taskType":"FAIL","state":"COMPLETED","attempts":2,"maxAttempts":3,"workerId":null,"result":"ok","error":"attempt 1 failed","createdAtMillis":1700000000000,"updatedAtMillis":1700000000900,"priority":"LOW"}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := protocol.Encode(tc.msg)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if string(got) != tc.want {
				t.Fatalf("Encode\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

// specFields are the field names PROTOCOL.md gives each message; a zero message must
// be written with exactly these (every field, none of the native extensions).
var specFields = map[protocol.Type][]string{
	protocol.TypeWorkerRegister:   {"workerId", "capacity"},
	protocol.TypeWorkerRegistered: {"workerId"},
	protocol.TypeHeartbeat:        {"workerId"},
	protocol.TypeTaskAssign:       {"jobId", "attemptId", "attemptNumber", "taskType", "payload"},
	protocol.TypeTaskCancel:       {"jobId", "attemptId"},
	protocol.TypeTaskResult:       {"workerId", "jobId", "attemptId", "success", "result", "error"},
	protocol.TypeError:            {"message"},
	protocol.TypeSubmitJob:        {"taskType", "payload", "maxAttempts", "idempotencyKey", "priority"},
	protocol.TypeJobSubmitted:     {"jobId"},
	protocol.TypeSubmitRejected:   {"reason", "activeCount", "limit", "retryable"},
	protocol.TypeGetJobStatus:     {"jobId"},
	protocol.TypeJobStatus:        {"job"},
	protocol.TypeListJobs:         {},
	protocol.TypeJobList:          {"jobs"},
	protocol.TypeListWorkers:      {},
	protocol.TypeWorkerList:       {"workers"},
	protocol.TypeCancelJob:        {"jobId"},
	protocol.TypeJobCancel:        {"cancelled", "job"},
	// Native extensions, in no spec.
	protocol.TypeListTaskTypes: {},
	protocol.TypeTaskTypeList:  {"taskTypes"},
	// Schedules (schedules.go).
	protocol.TypeAddSchedule:     {"schedule"},
	protocol.TypeListSchedules:   {},
	protocol.TypePauseSchedule:   {"name"},
	protocol.TypeResumeSchedule:  {"name"},
	protocol.TypeRemoveSchedule:  {"name"},
	protocol.TypeTriggerSchedule: {"name"},
	protocol.TypeScheduleInfo:    {"schedule"},
	protocol.TypeScheduleList:    {"schedules"},
	protocol.TypeListQueues:      {},
	protocol.TypeQueueList:       {"queues"},
	protocol.TypePauseQueue:      {"queue"},
	protocol.TypeResumeQueue:     {"queue"},
	protocol.TypeSetQueue:        {"queue"},
	protocol.TypeQueueUpdated:    {"queue"},
	protocol.TypeSetLimit:        {"scope", "name", "rate"},
	protocol.TypeRemoveLimit:     {"scope", "name"},
	protocol.TypeListLimits:      {},
	protocol.TypeLimitList:       {"limits"},
	protocol.TypeLimitRemoved:    {"limit"},
}

var snapshotFields = []string{"jobId", "taskType", "state", "attempts", "maxAttempts", "workerId",
	"result", "error", "createdAtMillis", "updatedAtMillis", "priority"}

func TestEncodeWritesEverySpecField(t *testing.T) {
	t.Parallel()
	for _, typ := range protocol.KnownTypes() {
		t.Run(string(typ), func(t *testing.T) {
			t.Parallel()
			want, ok := specFields[typ]
			if !ok {
				t.Fatalf("no spec fields listed for %s", typ)
			}
			// Decoding the bare envelope yields the zero message of that type.
			m, err := protocol.Decode([]byte(`{"type":"` + string(typ) + `"}`))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			data, err := protocol.Encode(m)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			fields := objectKeys(t, data)
			if got := withoutType(fields); !slices.Equal(got, sorted(want)) {
				t.Errorf("%s has fields %v, want %v", data, got, sorted(want))
			}
			if slices.Contains(want, "job") {
				var env struct{ Job json.RawMessage }
				if err := json.Unmarshal(data, &env); err != nil {
					t.Fatal(err)
				}
				if got := objectKeys(t, env.Job); !slices.Equal(got, sorted(snapshotFields)) {
					t.Errorf("snapshot has fields %v, want %v", got, sorted(snapshotFields))
				}
			}
		})
	}
}

func objectKeys(t *testing.T, data []byte) []string {
	t.Helper()
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	return slices.Sorted(func(yield func(string) bool) {
		for k := range obj {
			if !yield(k) {
				return
			}
		}
	})
}

func withoutType(keys []string) []string {
	return slices.DeleteFunc(keys, func(k string) bool { return k == "type" })
}

func sorted(s []string) []string {
	return slices.Sorted(slices.Values(s))
}

func TestEncodeWritesAbsentValuesAsNull(t *testing.T) {
	t.Parallel()
	tests := []struct {
		msg   protocol.Message
		nulls []string
	}{
		{&protocol.TaskResult{}, []string{"result", "error"}},
		{&protocol.SubmitJob{}, []string{"payload", "idempotencyKey", "priority"}},
		{&protocol.TaskAssign{}, []string{"payload"}},
	}
	for _, tc := range tests {
		data, err := protocol.Encode(tc.msg)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range tc.nulls {
			if !bytes.Contains(data, []byte(`"`+f+`":null`)) {
				t.Errorf("%s: field %s not written as null", data, f)
			}
		}
	}
}

func TestEncodeRejectsNilMessage(t *testing.T) {
	t.Parallel()
	for _, m := range []protocol.Message{nil, (*protocol.Heartbeat)(nil), (*protocol.JobList)(nil)} {
		if data, err := protocol.Encode(m); err == nil {
			t.Errorf("Encode(%#v) = %s, want an error", m, data)
		}
	}
}

func TestEncodeJobListLeavesCallerJobsAlone(t *testing.T) {
	t.Parallel()
	jobs := []protocol.Job{{JobID: "a", Priority: protocol.PriorityHigh}, {JobID: "b"}}
	data, err := protocol.Encode(&protocol.JobList{Jobs: jobs})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(`"jobId":"b","taskType":"","state":"","attempts":0,"maxAttempts":0,"workerId":null,"result":null,"error":null,"createdAtMillis":0,"updatedAtMillis":0,"priority":"NORMAL"`)) {
		t.Errorf("unset priority not written as NORMAL: %s", data)
	}
	if jobs[1].Priority != "" {
		t.Errorf("Encode changed the caller's job: priority %q", jobs[1].Priority)
	}
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		unknown bool   // the error must also wrap ErrUnknownType
		mention string // the error text must contain this (the field's name)
	}{
		{name: "NonJSON", in: `hello`},
		{name: "Empty", in: ``},
		{name: "Truncated", in: `{"type":"HEARTBEAT","workerId":"w"`},
		{name: "TrailingGarbage", in: `{"type":"HEARTBEAT"} x`},
		{name: "TwoObjects", in: `{"type":"HEARTBEAT"}{"type":"HEARTBEAT"}`},
		{name: "Array", in: `[{"type":"HEARTBEAT"}]`, mention: "object"},
		{name: "String", in: `"HEARTBEAT"`, mention: "object"},
		{name: "Number", in: `42`, mention: "object"},
		{name: "Null", in: `null`, mention: "type"},
		{name: "MissingType", in: `{"workerId":"w"}`, mention: "type"},
		{name: "NullType", in: `{"type":null,"workerId":"w"}`, mention: "type"},
		{name: "TypeNotString", in: `{"type":5}`, mention: "type"},
		{name: "TypeArray", in: `{"type":["HEARTBEAT"]}`, mention: "type"},
		{name: "UnknownType", in: `{"type":"REBOOT"}`, unknown: true, mention: "REBOOT"},
		{name: "UnknownTypeQuotedInError", in: `{"type":"A\nB"}`, unknown: true, mention: `"A\nB"`},
		{name: "EmptyType", in: `{"type":""}`, unknown: true},
		{name: "LowerCaseType", in: `{"type":"heartbeat","workerId":"w"}`, unknown: true, mention: "heartbeat"},
		{name: "IntegerAsString", in: `{"type":"WORKER_REGISTER","workerId":"w","capacity":"5"}`, mention: "capacity"},
		{name: "IntegerAsFraction", in: `{"type":"WORKER_REGISTER","workerId":"w","capacity":1.5}`, mention: "capacity"},
		{name: "IntegerWithPoint", in: `{"type":"WORKER_REGISTER","workerId":"w","capacity":1.0}`, mention: "capacity"},
		{name: "IntegerWithExponent", in: `{"type":"WORKER_REGISTER","workerId":"w","capacity":1e2}`, mention: "capacity"},
		{name: "IntegerAsBool", in: `{"type":"WORKER_REGISTER","workerId":"w","capacity":true}`, mention: "capacity"},
		{name: "IntegerOverflow", in: `{"type":"WORKER_REGISTER","workerId":"w","capacity":99999999999999999999}`, mention: "capacity"},
		{name: "StringAsNumber", in: `{"type":"HEARTBEAT","workerId":7}`, mention: "workerId"},
		{name: "StringAsObject", in: `{"type":"ERROR","message":{}}`, mention: "message"},
		{name: "AttemptNumberAsString", in: `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":"1","taskType":"SLEEP","payload":{}}`, mention: "attemptNumber"},
		{name: "BoolAsString", in: `{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":"true"}`, mention: "success"},
		{name: "BoolAsNumber", in: `{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":1}`, mention: "success"},
		{name: "ResultAsNumber", in: `{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":true,"result":42}`, mention: "result"},
		{name: "MaxAttemptsAsString", in: `{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{},"maxAttempts":"3"}`, mention: "maxAttempts"},
		{name: "IdempotencyKeyAsNumber", in: `{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{},"idempotencyKey":5}`, mention: "idempotencyKey"},
		{name: "PriorityUnknown", in: `{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{},"priority":"URGENT"}`, mention: "priority"},
		{name: "PriorityLowerCase", in: `{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{},"priority":"high"}`, mention: "priority"},
		{name: "PriorityEmpty", in: `{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{},"priority":""}`, mention: "priority"},
		{name: "PriorityAsNumber", in: `{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{},"priority":2}`, mention: "priority"},
		{name: "ActiveCountAsString", in: `{"type":"SUBMIT_REJECTED","reason":"r","activeCount":"1","limit":1,"retryable":true}`, mention: "activeCount"},
		{name: "RetryableAsString", in: `{"type":"SUBMIT_REJECTED","reason":"r","activeCount":1,"limit":1,"retryable":"yes"}`, mention: "retryable"},
		{name: "JobNotObject", in: `{"type":"JOB_STATUS","job":"j1"}`, mention: "job"},
		{name: "SnapshotAttemptsAsString", in: `{"type":"JOB_STATUS","job":{"jobId":"j","attempts":"1"}}`, mention: "job.attempts"},
		{name: "SnapshotMillisAsFraction", in: `{"type":"JOB_STATUS","job":{"jobId":"j","createdAtMillis":1.5}}`, mention: "createdAtMillis"},
		{name: "SnapshotPriorityLowerCase", in: `{"type":"JOB_STATUS","job":{"jobId":"j","priority":"low"}}`, mention: "priority"},
		{name: "SnapshotWorkerIdAsNumber", in: `{"type":"JOB_CANCEL","cancelled":true,"job":{"workerId":3}}`, mention: "workerId"},
		{name: "CancelledAsString", in: `{"type":"JOB_CANCEL","cancelled":"true","job":{}}`, mention: "cancelled"},
		{name: "JobsNotArray", in: `{"type":"JOB_LIST","jobs":{}}`, mention: "jobs"},
		{name: "JobsElementNotObject", in: `{"type":"JOB_LIST","jobs":[1]}`, mention: "jobs"},
		{name: "WorkerCapacityAsString", in: `{"type":"WORKER_LIST","workers":[{"workerId":"w","capacity":"2"}]}`, mention: "capacity"},
		{name: "ListLimitAsString", in: `{"type":"LIST_JOBS","limit":"10"}`, mention: "limit"},
		{name: "ListStateAsNumber", in: `{"type":"LIST_JOBS","state":1}`, mention: "state"},
		{name: "TaskTypesNotArray", in: `{"type":"WORKER_REGISTER","workerId":"w","capacity":1,"taskTypes":"SLEEP"}`, mention: "taskTypes"},
		{name: "PayloadInvalid", in: `{"type":"TASK_ASSIGN","payload":{"a":}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, err := protocol.Decode([]byte(tc.in))
			if err == nil {
				t.Fatalf("Decode(%s) = %#v, want an error", tc.in, m)
			}
			if m != nil {
				t.Errorf("Decode returned a message with its error: %#v", m)
			}
			if !errors.Is(err, protocol.ErrMalformed) {
				t.Errorf("error %q does not wrap ErrMalformed", err)
			}
			if got := errors.Is(err, protocol.ErrUnknownType); got != tc.unknown {
				t.Errorf("errors.Is(%q, ErrUnknownType) = %v, want %v", err, got, tc.unknown)
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not mention %q", err, tc.mention)
			}
		})
	}
}

func TestDecodeAccepts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want protocol.Message
	}{
		{"UnknownFieldsIgnored",
			`{"type":"HEARTBEAT","v":1,"workerId":"w","extra":{"nested":[1,"x",null]},"load":0.5}`,
			&protocol.Heartbeat{WorkerID: "w"}},
		{"TypeNotFirst",
			`{"workerId":"w","capacity":2,"type":"WORKER_REGISTER"}`,
			&protocol.WorkerRegister{WorkerID: "w", Capacity: 2}},
		{"Whitespace",
			" \n{ \"type\" : \"HEARTBEAT\" ,\t\"workerId\" : \"w\" }\r\n",
			&protocol.Heartbeat{WorkerID: "w"}},
		{"NegativeInteger",
			`{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"durationMillis":1},"maxAttempts":-1}`,
			&protocol.SubmitJob{TaskType: "SLEEP", Payload: json.RawMessage(`{"durationMillis":1}`), MaxAttempts: -1}},
		{"SubmitJobOptionalFieldsAbsent",
			`{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"durationMillis":1},"maxAttempts":2}`,
			&protocol.SubmitJob{TaskType: "SLEEP", Payload: json.RawMessage(`{"durationMillis":1}`), MaxAttempts: 2}},
		{"SubmitJobOptionalFieldsNull",
			`{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"durationMillis":1},"maxAttempts":2,"idempotencyKey":null,"priority":null}`,
			&protocol.SubmitJob{TaskType: "SLEEP", Payload: json.RawMessage(`{"durationMillis":1}`), MaxAttempts: 2}},
		{"SubmitJobOptionalFieldsSet",
			`{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"durationMillis":1},"maxAttempts":2,"idempotencyKey":"k","priority":"LOW"}`,
			&protocol.SubmitJob{TaskType: "SLEEP", Payload: json.RawMessage(`{"durationMillis":1}`), MaxAttempts: 2, IdempotencyKey: ptr("k"), Priority: ptr(protocol.PriorityLow)}},
		{"PayloadAbsentStaysNil",
			`{"type":"SUBMIT_JOB","taskType":"SLEEP"}`,
			&protocol.SubmitJob{TaskType: "SLEEP"}},
		{"PayloadNullIsNil",
			`{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"SLEEP","payload":null}`,
			&protocol.TaskAssign{JobID: "j", AttemptID: "a", AttemptNumber: 1, TaskType: "SLEEP"}},
		{"PayloadKeptVerbatim",
			`{"type":"TASK_ASSIGN","payload": { "text" : "a <b>" } ,"jobId":"j"}`,
			&protocol.TaskAssign{JobID: "j", Payload: json.RawMessage(`{ "text" : "a <b>" }`)}},
		{"PayloadNotObjectIsTheValidatorsJob",
			`{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":[1,2]}`,
			&protocol.SubmitJob{TaskType: "SLEEP", Payload: json.RawMessage(`[1,2]`)}},
		{"TaskResultOptionalFieldsAbsent",
			`{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":true}`,
			&protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Success: true}},
		{"TaskTypesEmpty",
			`{"type":"WORKER_REGISTER","workerId":"w","capacity":1,"taskTypes":[]}`,
			&protocol.WorkerRegister{WorkerID: "w", Capacity: 1, TaskTypes: []protocol.TaskTypeDecl{}}},
		{"SnapshotOptionalFieldsAbsent",
			`{"type":"JOB_STATUS","job":{"jobId":"j","taskType":"SLEEP","state":"QUEUED","attempts":0,"maxAttempts":3,"createdAtMillis":1,"updatedAtMillis":2,"priority":"HIGH"}}`,
			&protocol.JobStatus{Job: protocol.Job{JobID: "j", TaskType: "SLEEP", State: protocol.StateQueued, MaxAttempts: 3, CreatedAtMillis: 1, UpdatedAtMillis: 2, Priority: protocol.PriorityHigh}}},
		{"SnapshotPriorityAbsentIsNormal",
			`{"type":"JOB_STATUS","job":{"jobId":"j"}}`,
			&protocol.JobStatus{Job: protocol.Job{JobID: "j", Priority: protocol.PriorityNormal}}},
		{"SnapshotPriorityNullIsNormal",
			`{"type":"JOB_CANCEL","cancelled":true,"job":{"jobId":"j","priority":null}}`,
			&protocol.JobCancel{Cancelled: true, Job: protocol.Job{JobID: "j", Priority: protocol.PriorityNormal}}},
		{"JobListPriorityAbsentIsNormal",
			`{"type":"JOB_LIST","jobs":[{"jobId":"a"},{"jobId":"b","priority":"LOW"}]}`,
			&protocol.JobList{Jobs: []protocol.Job{{JobID: "a", Priority: protocol.PriorityNormal}, {JobID: "b", Priority: protocol.PriorityLow}}}},
		{"ListJobsFromSpecPeer",
			`{"type":"LIST_JOBS"}`,
			&protocol.ListJobs{}},
		{"ListWorkersWithUnknownField",
			`{"type":"LIST_WORKERS","filter":"all"}`,
			&protocol.ListWorkers{}},
		{"LargeMillis",
			`{"type":"WORKER_LIST","workers":[{"workerId":"w","capacity":1,"activeTasks":0,"lastHeartbeatMillis":9007199254740993}]}`,
			&protocol.WorkerList{Workers: []protocol.Worker{{WorkerID: "w", Capacity: 1, LastHeartbeatMillis: 9007199254740993}}}},
		{"UnicodeStrings",
			`{"type":"ERROR","message":"caf\u00e9 \u2713 \ud83d\ude00"}`,
			&protocol.Error{Message: "café ✓ 😀"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := protocol.Decode([]byte(tc.in))
			if err != nil {
				t.Fatalf("Decode(%s): %v", tc.in, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Decode(%s)\n got %#v\nwant %#v", tc.in, got, tc.want)
			}
		})
	}
}

func TestDecodeAs(t *testing.T) {
	t.Parallel()
	t.Run("MatchingType", func(t *testing.T) {
		t.Parallel()
		hb, err := protocol.DecodeAs[protocol.Heartbeat]([]byte(`{"type":"HEARTBEAT","workerId":"w"}`))
		if err != nil {
			t.Fatal(err)
		}
		if hb.WorkerID != "w" {
			t.Fatalf("WorkerID = %q, want w", hb.WorkerID)
		}
	})
	t.Run("OtherType", func(t *testing.T) {
		t.Parallel()
		m, err := protocol.DecodeAs[protocol.WorkerRegister]([]byte(`{"type":"HEARTBEAT","workerId":"w"}`))
		if m != nil || !errors.Is(err, protocol.ErrMalformed) {
			t.Fatalf("DecodeAs = %v, %v; want nil and ErrMalformed", m, err)
		}
		if errors.Is(err, protocol.ErrUnknownType) {
			t.Errorf("a known but unexpected type is not ErrUnknownType: %v", err)
		}
		for _, want := range []string{"WORKER_REGISTER", "HEARTBEAT"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not name %s", err, want)
			}
		}
	})
	t.Run("Malformed", func(t *testing.T) {
		t.Parallel()
		_, err := protocol.DecodeAs[protocol.WorkerRegister]([]byte(`{"type":"WORKER_REGISTER","capacity":"1"}`))
		if !errors.Is(err, protocol.ErrMalformed) || !strings.Contains(err.Error(), "capacity") {
			t.Fatalf("err = %v, want ErrMalformed naming capacity", err)
		}
	})
	t.Run("UnknownType", func(t *testing.T) {
		t.Parallel()
		_, err := protocol.DecodeAs[protocol.SubmitJob]([]byte(`{"type":"SUBMIT"}`))
		if !errors.Is(err, protocol.ErrUnknownType) {
			t.Fatalf("err = %v, want ErrUnknownType", err)
		}
	})
}

func TestPeekType(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    protocol.Type
		wantErr error
	}{
		{`{"type":"TASK_RESULT","workerId":"w"}`, protocol.TypeTaskResult, nil},
		// Only the type is read: a bad field elsewhere is Decode's business.
		{`{"success":"not a bool","type":"TASK_RESULT"}`, protocol.TypeTaskResult, nil},
		{`{"type":"LIST_WORKERS"}`, protocol.TypeListWorkers, nil},
		// Of duplicate keys the last counts, as in encoding/json, whatever the order.
		{`{"type":"HEARTBEAT","type":"LIST_WORKERS"}`, protocol.TypeListWorkers, nil},
		{`{"a":1,"type":"HEARTBEAT","type":"LIST_WORKERS"}`, protocol.TypeListWorkers, nil},
		{`{"type":"LIST_WORKERS","type":"NOPE"}`, "", protocol.ErrUnknownType},
		{`{"type":"NOPE"}`, "", protocol.ErrUnknownType},
		{`{}`, "", protocol.ErrMalformed},
		{`{"type":1}`, "", protocol.ErrMalformed},
		{`[]`, "", protocol.ErrMalformed},
		{`not json`, "", protocol.ErrMalformed},
	}
	for _, tc := range tests {
		got, err := protocol.PeekType([]byte(tc.in))
		if got != tc.want || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
			t.Errorf("PeekType(%s) = %q, %v; want %q, %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestMessageType(t *testing.T) {
	t.Parallel()
	for _, typ := range protocol.KnownTypes() {
		m, err := protocol.Decode([]byte(`{"type":"` + string(typ) + `"}`))
		if err != nil {
			t.Fatalf("Decode(%s): %v", typ, err)
		}
		if m.MessageType() != typ {
			t.Errorf("Decode(%s) gave a %T with MessageType %s", typ, m, m.MessageType())
		}
	}
}
