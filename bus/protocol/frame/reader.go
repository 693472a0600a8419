package frame

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

const (
	// readBufSize is the bufio buffer: one read() usually carries several
	// small frames, which are then cut from memory without more syscalls.
	readBufSize = 4096
	// minAlloc is the first payload buffer. Larger buffers grow by doubling
	// as bytes actually arrive, so a peer that declares 1 MiB and sends three
	// bytes costs us minAlloc, not 1 MiB.
	minAlloc = 4096
	// retainSize bounds the payload buffer kept between frames, so one big
	// frame does not pin a large buffer for the life of a connection.
	retainSize = 64 << 10
)

// ReaderOption configures a Reader.
type ReaderOption func(*Reader)

// WithMaxSize sets the largest payload the Reader accepts (default
// [MaxSize]); meant for tests. n <= 0 keeps the default.
func WithMaxSize(n int) ReaderOption {
	return func(r *Reader) {
		if n > 0 {
			r.max = n
		}
	}
}

// Reader reads frames from a byte stream. It is not safe for concurrent use:
// one goroutine (the connection's reader) owns it.
type Reader struct {
	br  *bufio.Reader
	max int

	hdr  [headerSize]byte
	hdrN int    // header bytes of the current frame read so far
	size int    // declared payload length; 0 until the header is complete
	buf  []byte // payload buffer, reused across frames; len is the read window
	bufN int    // payload bytes of the current frame read so far

	err error // sticky: io.EOF, ErrTruncated, ErrBadLength or ErrTooLarge
}

// NewReader returns a Reader that reads frames from r through a buffer.
func NewReader(r io.Reader, opts ...ReaderOption) *Reader {
	fr := &Reader{br: bufio.NewReaderSize(r, readBufSize), max: MaxSize}
	for _, opt := range opts {
		opt(fr)
	}
	return fr
}

// Read returns the next payload. The slice is owned by the Reader and valid
// only until the next call to Read; clone it to keep it.
//
// Read returns io.EOF itself when the stream ends cleanly between frames,
// ErrTruncated when it ends inside a frame, and ErrBadLength or ErrTooLarge
// for a bad length prefix. These errors are final: the stream can no longer
// be trusted and every later Read returns the same error. Any other error
// comes from the underlying reader (wrapped); the partial frame is kept and
// the next Read continues it.
func (r *Reader) Read() ([]byte, error) {
	if r.err != nil {
		return nil, r.err
	}
	if r.size == 0 {
		if err := r.readHeader(); err != nil {
			return nil, err
		}
	}
	if err := r.readPayload(); err != nil {
		return nil, err
	}
	p := r.buf[:r.size:r.size]
	r.hdrN, r.size, r.bufN = 0, 0, 0
	return p, nil
}

// Started reports whether a frame has begun arriving: part of it has been
// read, or bytes of it wait in the buffer. A session uses it to choose
// between its idle deadline and its shorter frame-stall deadline.
func (r *Reader) Started() bool {
	return r.err == nil && (r.hdrN > 0 || r.br.Buffered() > 0)
}

func (r *Reader) readHeader() error {
	if r.hdrN == 0 && cap(r.buf) > retainSize {
		r.buf = nil
	}
	n, err := io.ReadFull(r.br, r.hdr[r.hdrN:])
	r.hdrN += n
	if err != nil {
		if !isEOF(err) {
			return fmt.Errorf("frame: read header: %w", err)
		}
		if r.hdrN == 0 {
			return r.fail(io.EOF)
		}
		return r.fail(fmt.Errorf("%w: %d of %d header bytes", ErrTruncated, r.hdrN, headerSize))
	}
	// Signed, as DataInputStream.readInt: 0x80000000 and up are negative.
	size := int32(binary.BigEndian.Uint32(r.hdr[:]))
	if err := checkSize(size, r.max); err != nil {
		return r.fail(err)
	}
	r.size = int(size)
	r.buf = r.buf[:0]
	return nil
}

func (r *Reader) readPayload() error {
	for r.bufN < r.size {
		if r.bufN == len(r.buf) {
			r.grow()
		}
		n, err := io.ReadFull(r.br, r.buf[r.bufN:])
		r.bufN += n
		if err != nil {
			if isEOF(err) {
				return r.fail(fmt.Errorf("%w: %d of %d payload bytes", ErrTruncated, r.bufN, r.size))
			}
			return fmt.Errorf("frame: read payload: %w", err)
		}
	}
	return nil
}

// grow widens the read window: first into spare capacity, then into a new
// buffer of double the size (at least minAlloc), never beyond what the frame
// needs. Memory therefore tracks the bytes received, not the bytes declared.
func (r *Reader) grow() {
	if len(r.buf) < cap(r.buf) {
		r.buf = r.buf[:min(cap(r.buf), r.size)]
		return
	}
	c := min(max(2*cap(r.buf), minAlloc), max(r.size, minAlloc))
	nb := make([]byte, min(c, r.size), c)
	copy(nb, r.buf[:r.bufN])
	r.buf = nb
}

func (r *Reader) fail(err error) error {
	r.err = err
	return err
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
