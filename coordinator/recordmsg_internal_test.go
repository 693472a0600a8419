package coordinator

import (
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// referenceRecordMsg is a record's message as it was built with nats.NewMsg and
// Header.Set: recordMsg must build the same.
func referenceRecordMsg(s *jsStore, w *pendingWrite) *nats.Msg {
	m := nats.NewMsg(jobsSubjects + w.id)
	m.Data = w.data
	m.Header.Set(protocol.HeaderSeq, strconv.FormatUint(w.seq, 10))
	m.Header.Set(protocol.HeaderState, string(w.state))
	if w.rev == 0 {
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(s.termSeq, 10))
		m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, termSubject)
	} else {
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(w.rev, 10))
	}
	if w.ttl > 0 {
		m.Header.Set(jetstream.MsgTTLHeader, w.ttl.String())
		m.Header.Set(protocol.HeaderExpires, strconv.FormatInt(w.expires, 10))
	}
	if w.uniqueUntil > 0 || w.state == protocol.StateScheduled {
		m.Header.Set(protocol.HeaderUniqueUntil, strconv.FormatInt(w.uniqueUntil, 10))
	}
	if w.runAt != 0 {
		m.Header.Set(protocol.HeaderRunAt, strconv.FormatInt(w.runAt, 10))
	}
	if w.queue != "" {
		m.Header.Set(protocol.HeaderQueue, w.queue)
	}
	return m
}

var recordWrites = []struct {
	name string
	w    pendingWrite
}{
	{"Create", pendingWrite{id: "0f8e5c8a-6a43-4d5e-9a7e-0d3d0b7a7c11", seq: 1, state: protocol.StateQueued, data: []byte(`{"a":1}`)}},
	{"CreateRunning", pendingWrite{id: "j-2", seq: 18446744073709551615, state: protocol.StateRunning}},
	{"Update", pendingWrite{id: "j-3", seq: 42, rev: 123456789, state: protocol.StateRunning, data: []byte(`{}`)}},
	{"Finish", pendingWrite{id: "j-4", seq: 43, rev: 7, state: protocol.StateCompleted, ttl: 24 * time.Hour, expires: 1790000000123}},
	{"FinishNewTTL", pendingWrite{id: "j-5", seq: 44, rev: 8, state: protocol.StateFailed, ttl: 90 * time.Second, expires: 1}},
	{"CreateFinished", pendingWrite{id: "j-6", seq: 45, state: protocol.StateCancelled, ttl: time.Second, expires: 2}},
	{"Scheduled", pendingWrite{id: "j-7", seq: 46, state: protocol.StateScheduled, runAt: 1790000000456, queue: protocol.DefaultQueue}},
	{"ScheduledUnique", pendingWrite{id: "j-8", seq: 47, state: protocol.StateScheduled, runAt: 1790000000789, uniqueUntil: 1790000000789, queue: "critical"}},
}

func TestRecordMsg(t *testing.T) {
	s := &jsStore{termSeq: 987654321}
	for _, tc := range recordWrites {
		t.Run(tc.name, func(t *testing.T) {
			want := referenceRecordMsg(s, &tc.w)
			msgs := s.messages(&tc.w)
			if len(msgs) != 1 {
				t.Fatalf("%d messages, want 1", len(msgs))
			}
			got := msgs[0]
			if got.Subject != want.Subject || string(got.Data) != string(want.Data) || got.Reply != "" {
				t.Errorf("subject %q data %q, want %q %q", got.Subject, got.Data, want.Subject, want.Data)
			}
			if !maps.EqualFunc(got.Header, want.Header, slices.Equal) {
				t.Errorf("headers %v, want %v", got.Header, want.Header)
			}
			// A header set later (a batch's) must not write into another value.
			got.Header.Add(protocol.HeaderSeq, "x")
			if !slices.Equal(got.Header[protocol.HeaderState], want.Header[protocol.HeaderState]) {
				t.Errorf("adding a value changed another header: %v", got.Header)
			}
			// A pipelined write's (pipeline.send): the same message, its reply
			// subject made with it.
			const reply = "_INBOX.abcdefghijklmnopqrstuv.wxyz0123.1z"
			var r recordMessage
			piped, subject := s.messagesIn(&r, &tc.w, []byte(reply))
			if len(piped) != 1 || piped[0] != &r.m {
				t.Fatalf("messagesIn: %d messages, want r's one", len(piped))
			}
			if subject != reply {
				t.Errorf("reply subject %q, want %q", subject, reply)
			}
			if p := piped[0]; p.Subject != want.Subject || string(p.Data) != string(want.Data) || p.Reply != "" ||
				!maps.EqualFunc(p.Header, want.Header, slices.Equal) {
				t.Errorf("messagesIn built %q %q %v, want %q %q %v", p.Subject, p.Data, p.Header, want.Subject, want.Data, want.Header)
			}
		})
	}
}

// TestRecordMsgAllocs: a record's message is 4 allocations at most (the message with
// its value backing, the header map, its one string).
func TestRecordMsgAllocs(t *testing.T) {
	s := &jsStore{termSeq: 987654321}
	for _, tc := range recordWrites {
		w := tc.w
		s.ttlText(w.ttl) // remembered, as after the first finished job
		if n := testing.AllocsPerRun(100, func() { recordMsg(s, &w) }); n > 4 {
			t.Errorf("%s: %.0f allocations, want at most 4", tc.name, n)
		}
	}
}

func BenchmarkRecordMsg(b *testing.B) {
	s := &jsStore{termSeq: 987654321}
	w := recordWrites[3].w
	b.Run("recordMsg", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			recordMsg(s, &w)
		}
	})
	b.Run("NewMsg-Set", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			referenceRecordMsg(s, &w)
		}
	})
}

// recordMsg is w's record message in one of its own, as a write outside the pipeline
// makes it (jsStore.messages).
func recordMsg(s *jsStore, w *pendingWrite) *recordMessage {
	r := &recordMessage{}
	s.buildRecordMsg(r, w, nil)
	return r
}

// TestMessageCount: what a write counts as its messages (messageCount, by which a
// batch read back after an unknown outcome gives each job its revision) is what it
// sends (messages): a binding before the record for a keyed finishing write, with a
// TTL or kept for ever, and for a keyed SCHEDULED job.
func TestMessageCount(t *testing.T) {
	s := &jsStore{termSeq: 5}
	for _, tc := range []struct {
		name string
		w    pendingWrite
		want int
	}{
		{"Active", pendingWrite{id: "j", key: "k", rev: 3, state: protocol.StateRunning}, 1},
		{"Unkeyed", pendingWrite{id: "j", rev: 3, state: protocol.StateCompleted, ttl: time.Hour}, 1},
		{"Finish", pendingWrite{id: "j", key: "k", rev: 3, state: protocol.StateCompleted, ttl: time.Hour}, 2},
		{"FinishKeptForever", pendingWrite{id: "j", key: "k", rev: 3, state: protocol.StateCancelled}, 2},
		{"Scheduled", pendingWrite{id: "j", key: "k", state: protocol.StateScheduled, runAt: 1796000000000}, 2},
	} {
		if got, n := len(s.messages(&tc.w)), tc.w.messageCount(); got != tc.want || n != got {
			t.Errorf("%s: %d messages, counted %d; want %d", tc.name, got, n, tc.want)
		}
	}
}

// TestRecordMessageRecoversAsTheCoordinators: a record written as RecordMessage makes
// it (a tool's, fillstore's) is recovered as the coordinator's own: a SCHEDULED job
// due beyond the schedule window is kept by its headers, not read whole, and a
// finished one is known by its headers with its retention's end.
func TestRecordMessageRecoversAsTheCoordinators(t *testing.T) {
	t.Parallel()
	now := time.Now()
	far := protocol.Record{JobID: "far", TaskType: "SHA256", State: protocol.StateScheduled, MaxAttempts: 3,
		Priority: protocol.PriorityNormal, Seq: 7, CreatedAt: now.UnixMilli(), UpdatedAt: now.UnixMilli(), RunAt: now.Add(time.Hour).UnixMilli()}
	m, err := RecordMessage(&far, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject != jobsSubjects+"far" || m.Header.Get(jetstream.ExpectedLastSubjSeqHeader) != "" {
		t.Fatalf("message %s %v: want the record's subject, without a leader's fencing", m.Subject, m.Header)
	}
	h, ok := readHead("far", m.Header, &jetstream.MsgMetadata{Timestamp: now})
	if !ok || h.seq != 7 || h.due != far.RunAt || h.queue != protocol.DefaultQueue || h.uniqueUntil != 0 {
		t.Fatalf("head %+v", h)
	}
	if readWhole(h, now.Add(time.Minute).UnixMilli()) {
		t.Error("a SCHEDULED record due beyond the window is read whole: taken for an older release's")
	}

	done := far
	done.JobID, done.State, done.RunAt, done.EndedAt = "done", protocol.StateCompleted, 0, now.UnixMilli()
	m, err = RecordMessage(&done, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	h, ok = readHead("done", m.Header, &jetstream.MsgMetadata{Timestamp: now})
	if !ok || h.state != protocol.StateCompleted || h.expires != now.Add(time.Hour).UnixMilli() || readWhole(h, now.UnixMilli()) {
		t.Fatalf("finished head %+v: want COMPLETED until %d, not read whole", h, now.Add(time.Hour).UnixMilli())
	}
	if ttl := m.Header.Get(jetstream.MsgTTLHeader); ttl == "" {
		t.Fatalf("finished record without a TTL: %v", m.Header)
	}
}
