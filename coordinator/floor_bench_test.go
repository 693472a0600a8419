package coordinator_test

import (
	"bytes"
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/testkit"
)

// BenchmarkNATSFloor measures what NATS alone costs a job with the messages and writes
// jobbus makes for one, and nothing of jobbus: a submission and its reply from a
// client on loopback TCP, the job's record created in a KV bucket and updated once
// (each write fenced by the record's last sequence, acknowledged before anything
// depends on it), its assignment to a worker on TCP in the batches that are ready at
// once, and its result in the batches that finish while one is in flight, answered
// once its write is acknowledged. Every message carries raw bytes (no encoding) and
// the "coordinator" keeps only a map, so the CPU it reports (the whole process:
// server, connections, JetStream) is a floor under jobbus bench's on the peers'
// workload: 16 submitters, one worker of 64 slots.
//
//	go test -run '^$' -bench NATSFloor -benchtime 20000x -count 5 ./coordinator/
//
// Packed writes the records of the writes ready at once as one message of a stream
// instead of a message a record: what a job would cost if the store were a log of
// batches rather than a key a job.
func BenchmarkNATSFloor(b *testing.B) {
	b.Run("KeyPerJob", func(b *testing.B) { runFloor(b, false) })
	b.Run("Packed", func(b *testing.B) { runFloor(b, true) })
}

func runFloor(b *testing.B, packed bool) {
	f := startFloor(b, packed)
	payload := bytes.Repeat([]byte("x"), 100)
	var next atomic.Int64
	var wg sync.WaitGroup
	cpu, msgs := processCPU(b), f.messages()
	b.ResetTimer()
	for range 16 {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if _, err := f.client.Request("floor.submit", payload, 10*time.Second); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	testkit.Eventually(b, time.Minute, "every job completed", func() bool { return f.completed.Load() >= int64(b.N) })
	b.StopTimer()
	b.ReportMetric(float64((processCPU(b)-cpu).Microseconds())/float64(b.N), "cpu-µs/job")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
	b.ReportMetric(float64(f.messages()-msgs)/float64(b.N), "msgs/job")
}

// floor is BenchmarkNATSFloor's system: the embedded server, a coordinator on an
// in-process connection, a worker and a client on TCP.
type floor struct {
	b                 *testing.B // its Error may be called from the callbacks
	srv               *embeddednats.Server
	coord, client, wk *nats.Conn
	record            []byte
	completed         atomic.Int64

	mu      sync.Mutex
	seqs    map[string]uint64 // job id -> its record's last sequence
	replies map[string]string // job id -> where its submission's reply goes
	assigns [][]byte          // jobs stored, their assignment not yet sent
	pending map[string]*resultBatch
	ackIn   string

	wmu      sync.Mutex
	results  [][]byte // results finished, not yet sent
	inFlight bool

	packed   bool
	pmu      sync.Mutex
	batch    []packedWrite // writes waiting for the one in flight
	flying   []packedWrite
	batchOut bool
}

// packedWrite is one record's write in a packed batch.
type packedWrite struct {
	id    string
	stage byte
}

// resultBatch is one of the worker's result messages waiting for its writes.
type resultBatch struct {
	reply string
	left  int
}

func startFloor(b *testing.B, packed bool) *floor {
	ctx := context.Background()
	srv, err := embeddednats.Start(ctx, embeddednats.WithStoreDir(b.TempDir()), embeddednats.WithListen("127.0.0.1:-1"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	f := &floor{b: b, srv: srv, record: bytes.Repeat([]byte("r"), 400), seqs: map[string]uint64{}, replies: map[string]string{}, pending: map[string]*resultBatch{}, packed: packed}
	if f.coord, err = srv.Connect(); err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(f.coord)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FLOORLOG", Subjects: []string{"floorlog"}, Storage: jetstream.FileStorage}); err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "FLOOR", History: 1, Storage: jetstream.FileStorage, LimitMarkerTTL: 5 * time.Second}); err != nil {
		b.Fatal(err)
	}
	for _, c := range []**nats.Conn{&f.client, &f.wk} {
		if *c, err = nats.Connect(srv.ClientURL()); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() { f.client.Close(); f.wk.Close(); f.coord.Close() })
	f.ackIn = f.coord.NewRespInbox()
	subs := []struct {
		nc   *nats.Conn
		subj string
		cb   nats.MsgHandler
	}{
		{f.coord, "floor.submit", f.submitted},
		{f.coord, f.ackIn + ".*", f.acknowledged},
		{f.coord, "floor.results", f.resultsIn},
		{f.wk, "floor.assign", f.assigned},
		{f.wk, "floor.answers", f.answered},
	}
	for _, s := range subs {
		if _, err := s.nc.Subscribe(s.subj, s.cb); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []*nats.Conn{f.coord, f.wk} {
		if err := c.Flush(); err != nil {
			b.Fatal(err)
		}
	}
	return f
}

// messages is how many messages the server carried so far, in and out.
func (f *floor) messages() int64 {
	v, err := f.srv.NATS().Varz(nil)
	if err != nil {
		f.b.Fatal(err)
	}
	return v.InMsgs + v.OutMsgs
}

var jobIDs atomic.Int64

// write stores job id's record: a create when last is 0, else an update of that
// sequence; the acknowledgement comes to acknowledged, tagged with stage.
func (f *floor) write(id string, last uint64, stage byte) {
	if f.packed {
		f.pmu.Lock()
		f.batch = append(f.batch, packedWrite{id, stage})
		f.sendBatch()
		f.pmu.Unlock()
		return
	}
	h := nats.Header{
		"Jobbus-Seq":                        {"1"},
		"Jobbus-State":                      {"RUNNING"},
		jetstream.ExpectedLastSubjSeqHeader: {strconv.FormatUint(last, 10)},
	}
	if stage == 'c' {
		h["Jobbus-State"] = []string{"COMPLETED"}
		h[jetstream.MsgTTLHeader] = []string{"86402s"}
	}
	m := &nats.Msg{Subject: "$KV.FLOOR." + id, Reply: f.ackIn + "." + string(stage) + id, Header: h, Data: f.record}
	if err := f.coord.PublishMsg(m); err != nil {
		f.b.Error(err)
	}
}

// sendBatch sends the writes waiting as one message, unless one is in flight.
func (f *floor) sendBatch() {
	if f.batchOut || len(f.batch) == 0 {
		return
	}
	f.batchOut = true
	f.flying, f.batch = f.batch, nil // flying is read after the lock is let go
	data := make([]byte, 0, len(f.flying)*(len(f.record)+40))
	for _, w := range f.flying {
		data = append(append(append(data, w.id...), w.stage), f.record...)
	}
	m := &nats.Msg{Subject: "floorlog", Reply: f.ackIn + ".b", Header: nats.Header{"Jobbus-Term": {"1"}}, Data: data}
	if err := f.coord.PublishMsg(m); err != nil {
		f.b.Error(err)
	}
}

func (f *floor) submitted(m *nats.Msg) {
	id := "j" + strconv.FormatInt(jobIDs.Add(1), 10)
	f.mu.Lock()
	f.replies[id] = m.Reply
	f.mu.Unlock()
	f.write(id, 0, 's')
}

// acknowledged reads a write's acknowledgement; the assignments and answers it makes
// ready go out once no other acknowledgement waits behind it.
func (f *floor) acknowledged(m *nats.Msg) {
	tok := m.Subject[len(f.ackIn)+1:]
	if tok == "b" {
		f.pmu.Lock()
		done := f.flying
		f.batchOut = false
		f.sendBatch()
		f.pmu.Unlock()
		for _, w := range done {
			f.stored(m, w.stage, w.id, 1)
		}
		return
	}
	stage, id := tok[0], tok[1:]
	i := bytes.Index(m.Data, []byte(`"seq":`))
	if i < 0 {
		f.b.Errorf("write of %s refused: %s", id, m.Data)
		return
	}
	seq, _ := strconv.ParseUint(string(m.Data[i+6:i+6+bytes.IndexAny(m.Data[i+6:], ",}")]), 10, 64)
	f.stored(m, stage, id, seq)
}

// stored acts on the write of job id's record at stage, stored as sequence seq.
func (f *floor) stored(m *nats.Msg, stage byte, id string, seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch stage {
	case 's':
		f.seqs[id] = seq
		_ = f.coord.Publish(f.replies[id], []byte(id))
		delete(f.replies, id)
		f.assigns = append(f.assigns, []byte(id))
	case 'c':
		delete(f.seqs, id)
		rb := f.pending[id]
		delete(f.pending, id)
		if rb.left--; rb.left == 0 {
			_ = f.coord.Publish(rb.reply, []byte("ok"))
		}
		f.completed.Add(1)
	}
	if n, _, _ := m.Sub.Pending(); n <= 1 && len(f.assigns) > 0 {
		_ = f.coord.Publish("floor.assign", bytes.Join(f.assigns, []byte(" ")))
		f.assigns = f.assigns[:0]
	}
}

func (f *floor) resultsIn(m *nats.Msg) {
	ids := bytes.Fields(m.Data)
	rb := &resultBatch{reply: m.Reply, left: len(ids)}
	f.mu.Lock()
	for _, id := range ids {
		f.pending[string(id)] = rb
	}
	f.mu.Unlock()
	for _, id := range ids {
		f.mu.Lock()
		last := f.seqs[string(id)]
		f.mu.Unlock()
		f.write(string(id), last, 'c')
	}
}

// assigned runs the jobs of an assignment (they do nothing) and sends their results,
// those finished while a batch is in flight together once it is answered.
func (f *floor) assigned(m *nats.Msg) {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	f.results = append(f.results, bytes.Fields(m.Data)...)
	f.sendResults()
}

func (f *floor) answered(*nats.Msg) {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	f.inFlight = false
	f.sendResults()
}

func (f *floor) sendResults() {
	if f.inFlight || len(f.results) == 0 {
		return
	}
	f.inFlight = true
	_ = f.wk.PublishRequest("floor.results", "floor.answers", bytes.Join(f.results, []byte(" ")))
	f.results = f.results[:0]
}
