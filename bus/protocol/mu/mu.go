// Package mu is the wire format of PowerJob's Mu transport: a MuMessage,
// framed by MuMessageCodec as a 4-byte big-endian length and the message's JSON, with
// PowerJob's field names (messageType, requestId, path, senderAddress, payload,
// errorMessage). The bridge's Mu port speaks it (bridge package docs), and so does the
// reference node of `jobbus mu-node`. The frame is the same as PROTOCOL.md's (package
// frame), so the same bounds hold: 1 byte to 1 MiB.
package mu

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
)

// Type is a MuMessage's messageType.
type Type string

// The messageTypes of PowerJob's MessageType enum.
const (
	TypeTell      Type = "TELL"      // one-way message
	TypeAsk       Type = "ASK"       // request expecting one RESPONSE or ERROR with its requestId
	TypeResponse  Type = "RESPONSE"  // answer to an ASK
	TypeError     Type = "ERROR"     // failed answer to an ASK (errorMessage), or a complaint about a message
	TypeHeartbeat Type = "HEARTBEAT" // registration (with senderAddress) and keep-alive
)

// Valid reports whether t is one of the five types.
func (t Type) Valid() bool {
	switch t {
	case TypeTell, TypeAsk, TypeResponse, TypeError, TypeHeartbeat:
		return true
	}
	return false
}

// Address is PowerJob's Address: where a node listens, which also names it.
type Address struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

// String is PowerJob's key for the address, host + ":" + port (registerWorkerChannel).
func (a Address) String() string { return a.Host + ":" + strconv.Itoa(a.Port) }

// ParseAddress reads "host:port" (or "[v6]:port"). A name without a port is that host
// with port 0.
func ParseAddress(s string) (Address, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		if s == "" {
			return Address{}, errors.New("mu: empty address")
		}
		return Address{Host: s}, nil
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return Address{}, fmt.Errorf("mu: address %q: port must be 0..65535", s)
	}
	if host == "" {
		return Address{}, fmt.Errorf("mu: address %q has no host", s)
	}
	return Address{Host: host, Port: p}, nil
}

// Message is PowerJob's MuMessage. Absent and null fields are zero; Encode leaves zero
// fields out, which Jackson reads as null.
type Message struct {
	MessageType   Type            `json:"messageType"`
	RequestID     string          `json:"requestId,omitempty"`
	Path          string          `json:"path,omitempty"`
	SenderAddress *Address        `json:"senderAddress,omitempty"`
	Payload       json.RawMessage `json:"payload,omitempty"`
	ErrorMessage  string          `json:"errorMessage,omitempty"`
}

// ErrMalformed: bytes that are not a MuMessage.
var ErrMalformed = errors.New("mu: malformed message")

// MaxHostBytes bounds senderAddress.host: it names a bus node, whose id is bounded.
const MaxHostBytes = 256

// Decode reads one MuMessage from a frame's payload: a JSON object whose messageType
// is one of the five, whose senderAddress (if any) has a port in 0..65535, and nothing
// after it. Field names are matched exactly, as Jackson does; unknown fields are
// ignored. Errors wrap ErrMalformed.
func Decode(data []byte) (*Message, error) {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, fmt.Errorf("%w: not a JSON object", ErrMalformed)
	}
	var raw struct {
		MessageType   *Type           `json:"messageType"`
		RequestID     *string         `json:"requestId"`
		Path          *string         `json:"path"`
		SenderAddress *Address        `json:"senderAddress"`
		Payload       json.RawMessage `json:"payload"`
		ErrorMessage  *string         `json:"errorMessage"`
	}
	if err := strictFields(trimmed); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(trimmed, &raw); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	m := &Message{SenderAddress: raw.SenderAddress, Payload: raw.Payload}
	if raw.MessageType == nil {
		return nil, fmt.Errorf("%w: no messageType", ErrMalformed)
	}
	m.MessageType = *raw.MessageType
	if !m.MessageType.Valid() {
		return nil, fmt.Errorf("%w: unknown messageType %q", ErrMalformed, m.MessageType)
	}
	m.RequestID, m.Path, m.ErrorMessage = deref(raw.RequestID), deref(raw.Path), deref(raw.ErrorMessage)
	if string(m.Payload) == "null" {
		m.Payload = nil
	}
	if a := m.SenderAddress; a != nil {
		if a.Port < 0 || a.Port > 65535 {
			return nil, fmt.Errorf("%w: senderAddress.port %d not in 0..65535", ErrMalformed, a.Port)
		}
		if len(a.Host) > MaxHostBytes {
			return nil, fmt.Errorf("%w: senderAddress.host of %d bytes exceeds %d", ErrMalformed, len(a.Host), MaxHostBytes)
		}
	}
	return m, nil
}

// strictFields refuses a top-level key that encoding/json would match to a field
// case-insensitively ("MessageType"), where Jackson would not: one spelling, one meaning.
func strictFields(data []byte) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	for k := range top {
		switch k {
		case "messageType", "requestId", "path", "senderAddress", "payload", "errorMessage":
			continue
		}
		for _, f := range [...]string{"messageType", "requestId", "path", "senderAddress", "payload", "errorMessage"} {
			if bytes.EqualFold([]byte(k), []byte(f)) {
				return fmt.Errorf("%w: field %q must be spelled %q", ErrMalformed, k, f)
			}
		}
	}
	return nil
}

// Encode writes m's JSON, the frame's payload. A payload that is not valid JSON fails.
// Strings are written as Jackson writes them, without escaping &, < and > (which
// json.Marshal would turn into \u0026, \u003c and \u003e, also inside a payload), so a
// payload travels byte for byte, compacted.
func Encode(m *Message) ([]byte, error) {
	if !m.MessageType.Valid() {
		return nil, fmt.Errorf("mu: encode: unknown messageType %q", m.MessageType)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// Payload turns bytes that travel on the bus into a MuMessage payload: valid JSON as it
// is, nothing as null, anything else as a JSON string of it.
func Payload(data []byte) json.RawMessage {
	switch {
	case len(data) == 0:
		return nil
	case json.Valid(data):
		return data
	}
	s, _ := json.Marshal(string(data))
	return s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
