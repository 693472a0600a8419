package frame

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// fuzzSmallMax is a second limit so short inputs also reach ErrTooLarge.
const fuzzSmallMax = 16

// FuzzReader checks the Reader against the framing rules themselves: on any
// input it must not panic, every payload fits the limit and re-encodes to the
// bytes consumed, the final error is the one the remaining bytes call for,
// and reading byte by byte gives the same result as reading in one piece.
func FuzzReader(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, max := range []int{MaxSize, fuzzSmallMax} {
			got, err := drain(NewReader(bytes.NewReader(data), WithMaxSize(max)))
			checkFrames(t, data, max, got, err)
			slow, slowErr := drain(NewReader(iotest.OneByteReader(bytes.NewReader(data)), WithMaxSize(max)))
			if len(slow) != len(got) || classify(slowErr) != classify(err) {
				t.Fatalf("max %d: byte-by-byte read gave %d payloads and %v; whole read gave %d and %v",
					max, len(slow), slowErr, len(got), err)
			}
		}
	})
}

func checkFrames(t *testing.T, data []byte, max int, got [][]byte, err error) {
	t.Helper()
	var consumed []byte
	for i, p := range got {
		if len(p) < 1 || len(p) > max {
			t.Fatalf("max %d: payload %d has %d bytes", max, i, len(p))
		}
		consumed = binary.BigEndian.AppendUint32(consumed, uint32(len(p)))
		consumed = append(consumed, p...)
	}
	if !bytes.HasPrefix(data, consumed) {
		t.Fatalf("max %d: payloads do not re-encode to the consumed input", max)
	}
	if want := expectedErr(data[len(consumed):], max); classify(err) != want {
		t.Fatalf("max %d: final error %v, want %v", max, err, want)
	}
}

// expectedErr is the error the framing rules demand for what is left after
// the last good frame.
func expectedErr(rest []byte, max int) error {
	if len(rest) == 0 {
		return io.EOF
	}
	if len(rest) < headerSize {
		return ErrTruncated
	}
	switch n := int32(binary.BigEndian.Uint32(rest)); {
	case n <= 0:
		return ErrBadLength
	case int64(n) > int64(max):
		return ErrTooLarge
	default:
		return ErrTruncated // a complete frame would have been returned
	}
}

// classify maps an error to its sentinel; io.EOF only when exactly io.EOF.
func classify(err error) error {
	if err == io.EOF {
		return io.EOF
	}
	for _, s := range []error{ErrTruncated, ErrBadLength, ErrTooLarge} {
		if errors.Is(err, s) {
			return s
		}
	}
	return err
}
