// Package frame implements the framing of PROTOCOL.md used on both TCP
// ports: every frame is a 4-byte big-endian payload length followed by that
// many payload bytes (UTF-8 JSON, though this package never looks inside).
// A declared length must be between 1 and [MaxSize]; anything else is a
// protocol violation.
//
// A [Reader] cuts a byte stream into payloads; [Append] and [Write] encode
// them. The package holds no goroutines and no global state.
//
// # Deadlines
//
// A Reader never sets deadlines; the session that owns the connection does.
// Errors from the underlying reader other than EOF (for example a read
// deadline expiring on a net.Conn) leave the Reader's state intact, so the
// next Read resumes the same frame where it stopped. Together with
// [Reader.Started] this lets a session use a long idle deadline between
// frames and a short "frame stall" deadline once a frame has begun, which is
// what stops a peer that trickles a frame one byte at a time:
//
//	conn.SetReadDeadline(time.Now().Add(idle))
//	payload, err := r.Read()
//	if errors.Is(err, os.ErrDeadlineExceeded) && r.Started() {
//		conn.SetReadDeadline(time.Now().Add(stall))
//		payload, err = r.Read() // same frame, continued
//	}
package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/jobbus/jobbus/bus/protocol"
)

// MaxSize is the largest payload PROTOCOL.md allows in one frame (1 MiB).
const MaxSize = protocol.MaxMessage

// headerSize is the length of the big-endian length prefix.
const headerSize = 4

var (
	// ErrTooLarge reports a payload, declared or given, above the maximum.
	ErrTooLarge = errors.New("frame: payload too large")
	// ErrBadLength reports a declared length <= 0 (the prefix is a signed
	// int32, as Java's DataInputStream.readInt reads it) or an empty payload.
	ErrBadLength = errors.New("frame: length must be positive")
	// ErrTruncated reports EOF inside a frame: the connection broke mid-frame.
	// It also matches io.ErrUnexpectedEOF.
	ErrTruncated = fmt.Errorf("frame: truncated frame: %w", io.ErrUnexpectedEOF)
)

// Append appends the frame carrying payload (header and payload) to dst and
// returns the extended slice. On error dst is returned unchanged.
func Append(dst, payload []byte) ([]byte, error) {
	if err := checkSize(len(payload), MaxSize); err != nil {
		return dst, err
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(payload)))
	return append(dst, payload...), nil
}

// Write writes the frame carrying payload to w with a single w.Write call, so
// writers that share a connection under a mutex can never interleave frames,
// and a frame is never half-written by this package because of a bad size.
func Write(w io.Writer, payload []byte) error {
	buf, err := Append(make([]byte, 0, headerSize+len(payload)), payload)
	if err != nil {
		return err
	}
	n, err := w.Write(buf)
	if err != nil {
		return fmt.Errorf("frame: write: %w", err)
	}
	if n != len(buf) {
		return fmt.Errorf("frame: write: %w", io.ErrShortWrite)
	}
	return nil
}

// checkSize validates a payload length against max. It also takes the raw
// int32 of a header, so a declared length is checked before it sizes anything.
func checkSize[T int | int32](n T, max int) error {
	switch {
	case n <= 0:
		return fmt.Errorf("%w: %d bytes", ErrBadLength, n)
	case int64(n) > int64(max):
		return fmt.Errorf("%w: %d bytes, max %d", ErrTooLarge, n, max)
	}
	return nil
}
