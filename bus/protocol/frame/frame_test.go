package frame

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// header returns a raw length prefix, including values Append refuses.
func header(n uint32) []byte {
	return binary.BigEndian.AppendUint32(nil, n)
}

func encode(t testing.TB, payloads ...[]byte) []byte {
	t.Helper()
	var out []byte
	for _, p := range payloads {
		var err error
		if out, err = Append(out, p); err != nil {
			t.Fatalf("Append(%d bytes): %v", len(p), err)
		}
	}
	return out
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func randomPayload(rng *rand.Rand, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(rng.Uint32())
	}
	return p
}

// drain reads until the first error and returns copies of the payloads.
func drain(r *Reader) ([][]byte, error) {
	var got [][]byte
	for {
		p, err := r.Read()
		if err != nil {
			return got, err
		}
		got = append(got, bytes.Clone(p))
	}
}

// wrappers deliver the same bytes in differently sized reads.
var wrappers = []struct {
	name string
	wrap func(io.Reader) io.Reader
}{
	{"Whole", func(r io.Reader) io.Reader { return r }},
	{"OneByte", iotest.OneByteReader},
	{"Half", iotest.HalfReader},
	{"DataErr", iotest.DataErrReader},
}

func TestReader(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	max := randomPayload(rng, MaxSize)
	a, b, c := []byte(`{"type":"HEARTBEAT","workerId":"w1"}`), []byte(`{}`), []byte(`x`)

	tests := []struct {
		name    string
		in      []byte
		opts    []ReaderOption
		want    [][]byte
		wantErr error // io.EOF must be returned exactly
	}{
		{name: "EmptyStreamIsCleanEOF", in: nil, wantErr: io.EOF},
		{name: "OneFrame", in: encode(t, a), want: [][]byte{a}, wantErr: io.EOF},
		{name: "TwoFrames", in: encode(t, a, b), want: [][]byte{a, b}, wantErr: io.EOF},
		{name: "ThreeFrames", in: encode(t, a, b, c), want: [][]byte{a, b, c}, wantErr: io.EOF},
		{name: "ExactlyMaxSize", in: encode(t, max), want: [][]byte{max}, wantErr: io.EOF},
		{name: "MaxSizePlusOne", in: cat(header(MaxSize+1), max, c), wantErr: ErrTooLarge},
		{name: "MaxInt32", in: cat(header(1<<31-1), a), wantErr: ErrTooLarge},
		{name: "ZeroLength", in: cat(header(0), a), wantErr: ErrBadLength},
		{name: "MinusOne", in: cat(header(0xFFFFFFFF), a), wantErr: ErrBadLength},
		{name: "MinInt32", in: cat(header(0x80000000), a), wantErr: ErrBadLength},
		{name: "BadLengthAfterGoodFrame", in: cat(encode(t, a), header(0)), want: [][]byte{a}, wantErr: ErrBadLength},
		{name: "TruncatedHeader1", in: []byte{0}, wantErr: ErrTruncated},
		{name: "TruncatedHeader2", in: []byte{0, 0}, wantErr: ErrTruncated},
		{name: "TruncatedHeader3", in: []byte{0, 0, 0}, wantErr: ErrTruncated},
		{name: "TruncatedHeaderAfterFrame", in: cat(encode(t, a), []byte{0, 0}), want: [][]byte{a}, wantErr: ErrTruncated},
		{name: "HeaderWithoutPayload", in: header(5), wantErr: ErrTruncated},
		{name: "TruncatedPayload", in: cat(header(10), []byte("12345")), wantErr: ErrTruncated},
		{name: "TruncatedMaxSizePayload", in: cat(header(MaxSize), max[:MaxSize-1]), wantErr: ErrTruncated},
		{name: "TruncatedAfterTwoFrames", in: cat(encode(t, a, b), header(3), []byte("x")), want: [][]byte{a, b}, wantErr: ErrTruncated},
		{name: "CustomMaxAccepts", in: encode(t, []byte("12345678")), opts: []ReaderOption{WithMaxSize(8)}, want: [][]byte{[]byte("12345678")}, wantErr: io.EOF},
		{name: "CustomMaxRejects", in: encode(t, []byte("123456789")), opts: []ReaderOption{WithMaxSize(8)}, wantErr: ErrTooLarge},
		{name: "NonPositiveMaxKeepsDefault", in: encode(t, max), opts: []ReaderOption{WithMaxSize(0)}, want: [][]byte{max}, wantErr: io.EOF},
	}
	for _, tt := range tests {
		for _, w := range wrappers {
			if w.name == "OneByte" && len(tt.in) > 64<<10 {
				continue // Half covers big inputs; byte by byte is slow under -race
			}
			t.Run(tt.name+"/"+w.name, func(t *testing.T) {
				t.Parallel()
				r := NewReader(w.wrap(bytes.NewReader(tt.in)), tt.opts...)
				got, err := drain(r)
				if len(got) != len(tt.want) {
					t.Fatalf("got %d payloads, want %d (err %v)", len(got), len(tt.want), err)
				}
				for i := range got {
					if !bytes.Equal(got[i], tt.want[i]) {
						t.Errorf("payload %d: got %.40q (%d bytes), want %.40q (%d bytes)", i, got[i], len(got[i]), tt.want[i], len(tt.want[i]))
					}
				}
				assertErr(t, err, tt.wantErr)
				if _, again := r.Read(); again != err {
					t.Errorf("second Read after final error: got %v, want the same %v", again, err)
				}
				if r.Started() {
					t.Error("Started() = true after the stream ended")
				}
			})
		}
	}
}

func assertErr(t *testing.T, err, want error) {
	t.Helper()
	switch {
	case want == io.EOF:
		if err != io.EOF {
			t.Fatalf("got error %v, want io.EOF exactly", err)
		}
	case !errors.Is(err, want):
		t.Fatalf("got error %v, want %v", err, want)
	case want == ErrTruncated && !errors.Is(err, io.ErrUnexpectedEOF):
		t.Fatalf("error %v does not match io.ErrUnexpectedEOF", err)
	}
}

// countingReader counts calls to Read.
type countingReader struct {
	r     io.Reader
	calls int
}

func (c *countingReader) Read(p []byte) (int, error) {
	c.calls++
	return c.r.Read(p)
}

func TestSeveralFramesFromOneUnderlyingRead(t *testing.T) {
	t.Parallel()
	want := [][]byte{[]byte(`{"a":1}`), []byte(`{"b":2}`), []byte(`{"c":3}`)}
	cr := &countingReader{r: bytes.NewReader(encode(t, want...))}
	r := NewReader(cr)
	for i, w := range want {
		p, err := r.Read()
		if err != nil || !bytes.Equal(p, w) {
			t.Fatalf("frame %d: got %q, %v; want %q", i, p, err, w)
		}
		if more := i < len(want)-1; r.Started() != more {
			t.Errorf("after frame %d: Started() = %v, want %v", i, r.Started(), more)
		}
	}
	if cr.calls != 1 {
		t.Errorf("underlying Read called %d times for three frames in one chunk, want 1", cr.calls)
	}
}

func TestRoundTripSizes(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	sizes := []int{1, 2, 3, 4, 5, 100, minAlloc - 1, minAlloc, minAlloc + 1, readBufSize + 3,
		retainSize - 1, retainSize, retainSize + 1, 1 << 19, MaxSize - 1, MaxSize}
	var want [][]byte
	for _, n := range sizes {
		want = append(want, randomPayload(rng, n))
	}
	// Interleave small frames so buffers are reused, dropped and regrown.
	var stream [][]byte
	for i, p := range want {
		stream = append(stream, p, want[i%3])
	}
	in := encode(t, stream...)
	for _, w := range wrappers {
		if w.name == "OneByte" {
			continue // covered by TestReader; 3 MiB byte by byte is slow under -race
		}
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			got, err := drain(NewReader(w.wrap(bytes.NewReader(in))))
			assertErr(t, err, io.EOF)
			if len(got) != len(stream) {
				t.Fatalf("got %d payloads, want %d", len(got), len(stream))
			}
			for i := range got {
				if !bytes.Equal(got[i], stream[i]) {
					t.Errorf("payload %d: %d bytes differ from the %d sent", i, len(got[i]), len(stream[i]))
				}
			}
		})
	}
}

func TestAppend(t *testing.T) {
	t.Parallel()
	prefix := []byte("keep")
	tests := []struct {
		name    string
		payload []byte
		want    []byte
		wantErr error
	}{
		{name: "Small", payload: []byte("{}"), want: cat(prefix, header(2), []byte("{}"))},
		{name: "MaxSize", payload: make([]byte, MaxSize), want: cat(prefix, header(MaxSize), make([]byte, MaxSize))},
		{name: "Nil", payload: nil, wantErr: ErrBadLength},
		{name: "Empty", payload: []byte{}, wantErr: ErrBadLength},
		{name: "TooLarge", payload: make([]byte, MaxSize+1), wantErr: ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Append(bytes.Clone(prefix), tt.payload)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("got error %v, want %v", err, tt.wantErr)
				}
				if !bytes.Equal(got, prefix) {
					t.Fatalf("dst changed on error: %q", got)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tt.want) {
				t.Fatalf("got %.20q (%d bytes), %v; want %.20q (%d bytes)", got, len(got), err, tt.want, len(tt.want))
			}
		})
	}
}

// recordingWriter keeps every Write call separately.
type recordingWriter struct {
	calls [][]byte
	n     int // bytes to accept per call; <= 0 accepts all
	err   error
}

func (w *recordingWriter) Write(p []byte) (int, error) {
	w.calls = append(w.calls, bytes.Clone(p))
	if w.n > 0 && w.n < len(p) {
		return w.n, w.err
	}
	return len(p), w.err
}

func TestWrite(t *testing.T) {
	t.Parallel()
	broken := errors.New("broken pipe")
	tests := []struct {
		name      string
		payload   []byte
		w         *recordingWriter
		wantCalls int
		wantErr   error
	}{
		{name: "Small", payload: []byte(`{"type":"LIST_JOBS"}`), w: &recordingWriter{}, wantCalls: 1},
		{name: "MaxSize", payload: bytes.Repeat([]byte("a"), MaxSize), w: &recordingWriter{}, wantCalls: 1},
		{name: "EmptyWritesNothing", payload: nil, w: &recordingWriter{}, wantErr: ErrBadLength},
		{name: "TooLargeWritesNothing", payload: make([]byte, MaxSize+1), w: &recordingWriter{}, wantErr: ErrTooLarge},
		{name: "WriterError", payload: []byte("{}"), w: &recordingWriter{err: broken}, wantCalls: 1, wantErr: broken},
		{name: "ShortWrite", payload: []byte("{}"), w: &recordingWriter{n: 3}, wantCalls: 1, wantErr: io.ErrShortWrite},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := Write(tt.w, tt.payload)
			if tt.wantErr == nil && err != nil || !errors.Is(err, tt.wantErr) {
				t.Fatalf("got error %v, want %v", err, tt.wantErr)
			}
			if len(tt.w.calls) != tt.wantCalls {
				t.Fatalf("got %d Write calls, want %d", len(tt.w.calls), tt.wantCalls)
			}
			if tt.wantErr == nil && !bytes.Equal(tt.w.calls[0], encode(t, tt.payload)) {
				t.Fatalf("wrote %.20q, want header+payload in one buffer", tt.w.calls[0])
			}
		})
	}
}

// scriptedReader replays chunks, returning an error after a chunk when set.
type scriptedReader struct {
	steps []step
}

type step struct {
	data []byte
	err  error
}

func (s *scriptedReader) Read(p []byte) (int, error) {
	if len(s.steps) == 0 {
		return 0, io.EOF
	}
	st := &s.steps[0]
	n := copy(p, st.data)
	st.data = st.data[n:]
	if len(st.data) > 0 {
		return n, nil
	}
	err := st.err
	s.steps = s.steps[1:]
	return n, err
}

func TestReadResumesAfterTransientError(t *testing.T) {
	t.Parallel()
	transient := errors.New("transient")
	payload := bytes.Repeat([]byte("p"), 3*minAlloc) // resumes across buffer growth too
	frame := encode(t, payload, []byte("next"))
	for _, cut := range []int{1, 3, 4, 5, 4 + minAlloc, 4 + 2*minAlloc + 7, 4 + len(payload) + 2} {
		t.Run(fmt.Sprintf("CutAt%d", cut), func(t *testing.T) {
			t.Parallel()
			r := NewReader(&scriptedReader{steps: []step{{frame[:cut], transient}, {frame[cut:], nil}}})
			var got [][]byte
			var transients int
			for {
				p, err := r.Read()
				if errors.Is(err, transient) {
					transients++
					if !r.Started() {
						t.Fatalf("Started() = false after a transient error mid-frame (cut %d)", cut)
					}
					continue
				}
				if err != nil {
					assertErr(t, err, io.EOF)
					break
				}
				got = append(got, bytes.Clone(p))
			}
			if transients != 1 || len(got) != 2 || !bytes.Equal(got[0], payload) || string(got[1]) != "next" {
				t.Fatalf("got %d payloads after %d transient errors, want both frames intact after 1", len(got), transients)
			}
		})
	}
}

// allocatedBy returns the bytes the runtime allocated while f ran. Tests that
// use it are not parallel: parallel tests are paused while they run.
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestDeclaredLengthIsNotAllocatedUpFront(t *testing.T) {
	const limit = 64 << 10 // bufio buffer + first payload chunk + slack; far below 1 MiB
	tests := []struct {
		name    string
		in      []byte
		wantErr error
	}{
		{name: "MaxInt32RejectedBeforeAllocating", in: header(1<<31 - 1), wantErr: ErrTooLarge},
		{name: "OneMiBDeclaredThreeBytesSent", in: cat(header(MaxSize), []byte("abc")), wantErr: ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			got := allocatedBy(func() { _, err = NewReader(bytes.NewReader(tt.in)).Read() })
			assertErr(t, err, tt.wantErr)
			if got > limit {
				t.Fatalf("allocated %d bytes, want at most %d", got, limit)
			}
		})
	}
}

// tcpPair returns both ends of a real loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func TestConcurrentWritersOverTCPNeverInterleave(t *testing.T) {
	t.Parallel()
	client, server := tcpPair(t)
	const writers, perWriter = 4, 200
	var mu sync.Mutex // the session's write lock
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				// Sizes vary so frames straddle TCP segments and read buffers.
				p := bytes.Repeat([]byte{byte('a' + w)}, 1+(i*977)%(3*readBufSize))
				mu.Lock()
				err := Write(client, p)
				mu.Unlock()
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	r := NewReader(server)
	counts := make([]int, writers)
	for range writers * perWriter {
		p, err := r.Read()
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
		if bytes.Count(p, p[:1]) != len(p) || p[0] < 'a' || int(p[0]-'a') >= writers {
			t.Fatalf("frame of %d bytes mixes writers: %.40q", len(p), p)
		}
		counts[p[0]-'a']++
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Write: %v", err)
	}
	for w, n := range counts {
		if n != perWriter {
			t.Errorf("writer %d: got %d frames, want %d", w, n, perWriter)
		}
	}
}

// TestStallDeadlinePattern drives the package-doc pattern on a real socket:
// a read deadline expires mid-frame, Started reports it, and the next Read
// finishes the same frame once the rest arrives.
func TestStallDeadlinePattern(t *testing.T) {
	t.Parallel()
	client, server := tcpPair(t)
	r := NewReader(server)
	if r.Started() {
		t.Fatal("Started() = true before any byte arrived")
	}
	frame := encode(t, []byte(`{"type":"HEARTBEAT","workerId":"w1"}`))
	if _, err := client.Write(frame[:6]); err != nil {
		t.Fatal(err)
	}
	// Short deadlines until the partial frame has been taken in; the overall
	// deadline only bounds a broken test, it asserts no speed.
	deadline := time.Now().Add(10 * time.Second)
	for !r.Started() {
		if time.Now().After(deadline) {
			t.Fatal("partial frame never observed")
		}
		if err := server.SetReadDeadline(time.Now().Add(10 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if p, err := r.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read of a partial frame: got %q, %v; want a deadline error", p, err)
		}
	}
	if _, err := client.Write(frame[6:]); err != nil {
		t.Fatal(err)
	}
	if err := server.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	p, err := r.Read()
	if err != nil || !bytes.Equal(p, frame[4:]) {
		t.Fatalf("resumed Read: got %q, %v; want %q", p, err, frame[4:])
	}
	if r.Started() {
		t.Error("Started() = true after the frame completed")
	}
	client.Close()
	if _, err := r.Read(); err != io.EOF {
		t.Fatalf("Read after peer closed: got %v, want io.EOF", err)
	}
}

func TestEOFAfterTransientErrorKeepsFramePosition(t *testing.T) {
	t.Parallel()
	transient := errors.New("transient")
	frame := encode(t, []byte("payload"))
	tests := []struct {
		cut     int
		wantErr error
	}{
		{cut: 0, wantErr: io.EOF},
		{cut: 1, wantErr: ErrTruncated},
		{cut: 3, wantErr: ErrTruncated},
		{cut: 4, wantErr: ErrTruncated},
		{cut: 6, wantErr: ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("CutAt%d", tt.cut), func(t *testing.T) {
			t.Parallel()
			r := NewReader(&scriptedReader{steps: []step{{frame[:tt.cut], transient}}})
			if _, err := r.Read(); !errors.Is(err, transient) {
				t.Fatalf("first Read: got %v, want the transient error", err)
			}
			_, err := r.Read()
			assertErr(t, err, tt.wantErr)
		})
	}
}
