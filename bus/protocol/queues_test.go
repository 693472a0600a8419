package protocol_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

func TestParseQueueWeights(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		spec    string
		want    []protocol.QueueWeight
		wantErr string
	}{
		{spec: "critical=6,default=3,low=1", want: []protocol.QueueWeight{{"critical", 6}, {"default", 3}, {"low", 1}}},
		{spec: "a, b", want: []protocol.QueueWeight{{"a", 1}, {"b", 1}}},
		{spec: "only", want: []protocol.QueueWeight{{"only", 1}}},
		{spec: "", wantErr: "an empty element"},
		{spec: "a,,b", wantErr: "an empty element"},
		{spec: "a=0", wantErr: "must be in 1..1000, got 0"},
		{spec: "a=-2", wantErr: "must be in 1..1000, got -2"},
		{spec: "a=x", wantErr: `"x" is not an integer`},
		{spec: "a=1,a=2", wantErr: "listed twice"},
		{spec: "bad.name", wantErr: `name "bad.name"`},
		{spec: "a=1001", wantErr: "got 1001"},
	} {
		got, err := protocol.ParseQueueWeights(tc.spec)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, protocol.ErrBadQueue) {
				t.Errorf("ParseQueueWeights(%q) = %v, %v; want an ErrBadQueue containing %q", tc.spec, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseQueueWeights(%q) = %v, %v; want %v", tc.spec, got, err, tc.want)
		}
		if back, _ := protocol.ParseQueueWeights(protocol.FormatQueueWeights(got)); !reflect.DeepEqual(back, got) {
			t.Errorf("FormatQueueWeights does not read back: %v", back)
		}
	}
}

func TestCheckQueueName(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{
		"default": true, "critical-1": true, "low_prio": true, strings.Repeat("q", 64): true,
		"": false, "a.b": false, "a b": false, "a*": false, "a>": false, strings.Repeat("q", 65): false, "é": false,
	} {
		if err := protocol.CheckQueueName(name); (err == nil) != ok {
			t.Errorf("CheckQueueName(%q) = %v, want ok=%v", name, err, ok)
		}
	}
}

func TestQueueWeightJSON(t *testing.T) {
	t.Parallel()
	reg := protocol.WorkerRegister{WorkerID: "w", Capacity: 1,
		Queues: []protocol.QueueWeight{{"critical", 6}, {"default", 1}}, StrictQueues: true}
	data, err := protocol.Encode(&reg)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"queues":[{"name":"critical","weight":6},"default"],"strictQueues":true`; !strings.Contains(string(data), want) {
		t.Fatalf("encoded %s, want it to contain %s", data, want)
	}
	back, err := protocol.DecodeAs[protocol.WorkerRegister](data)
	if err != nil || !reflect.DeepEqual(back.Queues, reg.Queues) || !back.StrictQueues {
		t.Fatalf("decoded %+v, %v", back, err)
	}
	// An object without a weight has weight 1; a spec peer's registration has no queues.
	m, err := protocol.DecodeAs[protocol.WorkerRegister]([]byte(`{"type":"WORKER_REGISTER","workerId":"w","capacity":1,"queues":[{"name":"x"}]}`))
	if err != nil || !reflect.DeepEqual(m.Queues, []protocol.QueueWeight{{"x", 1}}) {
		t.Fatalf("decoded %+v, %v", m, err)
	}
	spec, _ := protocol.Encode(&protocol.WorkerRegister{WorkerID: "w", Capacity: 1})
	if strings.Contains(string(spec), "queues") {
		t.Fatalf("a registration without queues says %s", spec)
	}
	if _, err := protocol.DecodeAs[protocol.WorkerRegister]([]byte(`{"type":"WORKER_REGISTER","workerId":"w","capacity":1,"queues":[3]}`)); err == nil {
		t.Fatal("a number in queues decoded")
	}
}

func TestConcurrencyKeyAt(t *testing.T) {
	t.Parallel()
	payload := json.RawMessage(`{"customer":"c-42","n":17,"deep":{"a/b":{"~k":"x"}},"list":["p","q"],"no":null,"obj":{},"empty":""}`)
	for _, tc := range []struct {
		ptr, want, wantErr string
	}{
		{ptr: "/customer", want: "c-42"},
		{ptr: "/n", want: "17"},
		{ptr: "/deep/a~1b/~0k", want: "x"},
		{ptr: "/list/1", want: "q"},
		{ptr: "/missing", wantErr: `no member "missing"`},
		{ptr: "/no", wantErr: "names a null"},
		{ptr: "/obj", wantErr: "names a object"},
		{ptr: "/empty", wantErr: "1 to 256 bytes"},
		{ptr: "/list/2", wantErr: `no element "2"`},
		{ptr: "/list/01", wantErr: `no element "01"`},
		{ptr: "/customer/x", wantErr: "inside a string"},
		{ptr: "customer", wantErr: "must start with '/'"},
		{ptr: "/a~2", wantErr: "'~' must be followed"},
	} {
		got, err := protocol.ConcurrencyKeyAt(payload, tc.ptr)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ConcurrencyKeyAt(%s) = %q, %v; want an error containing %q", tc.ptr, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ConcurrencyKeyAt(%s) = %q, %v; want %q", tc.ptr, got, err, tc.want)
		}
	}
}

func TestQueueSettingsCheck(t *testing.T) {
	t.Parallel()
	if err := (protocol.QueueSettings{MaxRunning: 20, KeyConcurrency: 2}).Check(); err != nil {
		t.Fatal(err)
	}
	err := (protocol.QueueSettings{MaxRunning: -1, KeyConcurrency: -3}).Check()
	if err == nil || !strings.Contains(err.Error(), "maxRunning must be in") || !strings.Contains(err.Error(), "keyConcurrency must be in") {
		t.Fatalf("Check = %v, want both problems", err)
	}
	if err := (protocol.TaskTypeOptions{ConcurrencyKey: "customer"}).Check(); err == nil {
		t.Fatal("a pointer without '/' passed")
	}
}

// TestSubmitExtensionsDecodeAsWritten: the scanner of hot messages leaves a SUBMIT_JOB with
// extension fields to encoding/json, which reads them (it once dropped them); a member
// named like one in another case is an unknown member, and ignored.
func TestSubmitExtensionsDecodeAsWritten(t *testing.T) {
	t.Parallel()
	for _, data := range []string{
		`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"x"},"maxAttempts":0,"idempotencyKey":null,"priority":null,"queue":"reports","concurrencyKey":"k"}`,
		`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"x"},"queue":"reports","concurrencyKey":"k"}`,
		`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"x"},"queue":"reports","QUEUE":"other","concurrencyKey":"k","ConcurrencyKey":"j"}`,
	} {
		m, err := protocol.DecodeAs[protocol.SubmitJob]([]byte(data))
		if err != nil || m.Queue != "reports" || m.ConcurrencyKey != "k" || m.TaskType != "SHA256" {
			t.Errorf("decoded %s as %+v, %v", data, m, err)
		}
	}
	if m, err := protocol.DecodeAs[protocol.SubmitJob]([]byte(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"x"},"QUEUE":"reports"}`)); err != nil || m.Queue != "" {
		t.Errorf("QUEUE read as queue: %+v, %v", m, err)
	}
	m := &protocol.SubmitJob{TaskType: "SHA256", Payload: json.RawMessage(`{"text":"x"}`), Queue: "q"}
	data, _ := protocol.Encode(m)
	if back, err := protocol.DecodeAs[protocol.SubmitJob](data); err != nil || !reflect.DeepEqual(back, m) {
		t.Errorf("round trip of %s: %+v, %v", data, back, err)
	}
}
