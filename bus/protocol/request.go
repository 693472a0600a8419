package protocol

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// Headers of a client API request on NATS. A TCP frame carries none: the bridge adds
// them to what it forwards.
const (
	// HeaderRequestID names one submission across every time it is sent: the
	// coordinator gives the job the id RequestJobID derives from it, so a submission
	// sent again (its answer lost in a failover, or said to be unknown) finds the job a
	// former send created instead of creating another, on whichever coordinator leads
	// by then. 1 to MaxRequestID bytes; a client makes a fresh one per submission
	// (NewRequestID) and never reuses it for another.
	HeaderRequestID = "Jobbus-Request-Id"
	// HeaderRequestTry numbers a send again of one request, from 2; a first send
	// carries none (or 1). The first send of a fresh request id cannot have created
	// anything yet, so only a later one costs the coordinator a look among the jobs that
	// already finished: a request id sent again without this header may create its job
	// anew once the first one has left memory.
	HeaderRequestTry = "Jobbus-Request-Try"
	// MaxRequestID bounds a request id.
	MaxRequestID = 128
)

// NewRequestID returns a fresh request id: 128 random bits in hex.
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	var x [32]byte // hex.EncodeToString's buffer would be one allocation more
	hex.Encode(x[:], b[:])
	return string(x[:])
}

// RequestJobID is the id of the job a submission with request id rid creates: a
// version 8 UUID from the SHA-256 of rid (RFC 9562, appendix B.2), in the canonical
// form of every job id. The same request id always names the same job; a random
// (version 4) job id, or another request id, never does.
func RequestJobID(rid string) string {
	// The hash's input in a buffer on the stack, for every id a client makes
	// (NewRequestID's 32 bytes) and any other up to MaxRequestID: the concatenation
	// and its []byte took two allocations per submission.
	const prefix = "jobbus request\x00"
	var in [len(prefix) + MaxRequestID]byte
	var h [sha256.Size]byte
	if len(rid) <= MaxRequestID {
		n := copy(in[:], prefix)
		n += copy(in[n:], rid)
		h = sha256.Sum256(in[:n])
	} else {
		h = sha256.Sum256([]byte(prefix + rid))
	}
	u := h[:16]
	u[6] = u[6]&0x0f | 0x80 // version 8
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:36], u[10:16])
	return string(b[:])
}

// FirstTry reports whether a request's HeaderRequestTry value says it is its first
// send: none, or 1.
func FirstTry(try string) bool { return try == "" || try == "1" }

// TryValue is the HeaderRequestTry value of send n (from 1).
func TryValue(n int) string { return strconv.Itoa(n) }
