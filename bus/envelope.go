package bus

import (
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/nats-io/nats.go"
)

// Kind is a Mu message type, carried in the Jobbus-Kind header.
type Kind string

// The kinds of Mu.
const (
	KindTell      Kind = "TELL"      // one-way message
	KindAsk       Kind = "ASK"       // request expecting a RESPONSE or ERROR
	KindResponse  Kind = "RESPONSE"  // answer to an ASK
	KindError     Kind = "ERROR"     // failed answer to an ASK; the payload is the error text
	KindHeartbeat Kind = "HEARTBEAT" // presence announcement
)

// Headers of the Mu envelope. The payload is the message's JSON.
const (
	HeaderKind      = "Jobbus-Kind"
	HeaderRequestID = "Jobbus-Request-Id"
	HeaderPath      = "Jobbus-Path"
	// HeaderFrom names the sender of a heartbeat or goodbye ("role/idtoken"), which
	// presence checks against the presence subject. Tells and asks carry their sender in
	// the subject instead (Request.From).
	HeaderFrom = "Jobbus-From"
	// HeaderPresence is "leave" on the goodbye a node sends when it closes.
	HeaderPresence = "Jobbus-Presence"
)

// EnvelopeVersion is what the headers of a node's messages say. Every version reads
// both: a message without Jobbus-Kind is an ask when it has a reply subject and a tell
// otherwise, and an answer without it is a RESPONSE.
type EnvelopeVersion int

const (
	// Envelope1 puts Jobbus-Kind on every message, Jobbus-Path on tells and asks,
	// Jobbus-Request-Id on asks and answers.
	Envelope1 EnvelopeVersion = 1
	// Envelope2 sends tells, asks and RESPONSE answers without headers, since the
	// subject and the reply already say all of it: the path is the subject's end, the
	// request id the reply's last token, the kind whether there is a reply. nats.go
	// then parses no headers (about 11 allocations a job fewer). An ERROR answer,
	// heartbeats and goodbyes keep their headers. A node of Envelope1 reads it as
	// its own (an answer without a kind was a RESPONSE to it already).
	Envelope2 EnvelopeVersion = 2
)

// presenceLeave is the HeaderPresence value of a goodbye.
const presenceLeave = "leave"

// Request is a message delivered to a handler.
type Request struct {
	// From is the sender, as the subject names it: the publisher was allowed (by NATS
	// permissions, where there are any) to publish as it.
	From Address
	Path string // the path it was sent to
	Kind Kind   // KindTell or KindAsk
	ID   string // the request id of an ask
	Data []byte // the payload, usually JSON
}

// Decode unmarshals the payload into v (see Ask for the rules).
func (r *Request) Decode(v any) error { return decode(r.Data, v) }

// marshal encodes a message: []byte and json.RawMessage travel as they are, nil as an
// empty payload, a json.Marshaler as it writes itself, anything else as JSON.
func marshal(v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case []byte:
		return v, nil
	case json.RawMessage:
		return v, nil
	case json.Marshaler:
		// json.Marshal would check and compact what the marshaler wrote, a copy the
		// hot path (every jobbus message) does not need.
		if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && rv.IsNil() {
			return []byte("null"), nil // as json.Marshal writes it
		}
		return v.MarshalJSON()
	default:
		return json.Marshal(v)
	}
}

// Decoder is a message type that decodes a whole payload itself, with exactly
// json.Unmarshal's outcome (the same fields set, the same errors) but faster, as the
// protocol's hot messages do: decode uses it instead of json.Unmarshal.
type Decoder interface {
	DecodeJSON(data []byte) error
}

// decode reverses marshal. An empty payload leaves v as it is; *[]byte and
// *json.RawMessage receive the payload itself (NATS hands every message its own copy).
func decode(data []byte, v any) error {
	if len(data) == 0 {
		return nil
	}
	switch p := v.(type) {
	case *[]byte:
		*p = data
	case *json.RawMessage:
		*p = data
	case Decoder:
		return p.DecodeJSON(data)
	default:
		return json.Unmarshal(data, v)
	}
	return nil
}

// parseRequest reads the envelope of a message that arrived at a handler subject. A
// message without Jobbus-Kind is an ask when it has a reply subject, a tell otherwise,
// so plain NATS clients can use handlers too.
func parseRequest(m *nats.Msg, path string) (*Request, error) {
	h := m.Header
	req := &Request{Path: path, Data: m.Data, ID: first(h[HeaderRequestID])}
	switch k := Kind(first(h[HeaderKind])); k {
	case "":
		req.Kind = KindTell
		if m.Reply != "" {
			req.Kind = KindAsk
		}
	case KindTell, KindAsk, KindResponse, KindError, KindHeartbeat:
		req.Kind = k
	default:
		return req, fmt.Errorf("unknown %s %q", HeaderKind, k)
	}
	from, err := sender(m.Subject, path)
	if err != nil {
		return req, err
	}
	req.From = from
	return req, nil
}

func first(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

// outMsg is a reusable outgoing message. Its header values point into its own arrays,
// so filling it allocates nothing; it is used only for the duration of a publish
// (nats.go encodes the headers before PublishMsg returns).
type outMsg struct {
	m                             nats.Msg
	kind, id, path, from, present [1]string
}

func newOutMsg() any {
	return &outMsg{m: nats.Msg{Header: make(nats.Header, 5)}}
}

// set fills the envelope; an empty id, path or from leaves its header out.
func (o *outMsg) set(subj, reply string, k Kind, id, path, from string, data []byte) {
	o.m.Subject, o.m.Reply, o.m.Data = subj, reply, data
	o.kind[0] = string(k)
	o.m.Header[HeaderKind] = o.kind[:]
	setOpt(o.m.Header, HeaderFrom, &o.from, from)
	setOpt(o.m.Header, HeaderRequestID, &o.id, id)
	setOpt(o.m.Header, HeaderPath, &o.path, path)
	delete(o.m.Header, HeaderPresence)
}

func setOpt(h nats.Header, key string, arr *[1]string, v string) {
	if v == "" {
		delete(h, key)
		return
	}
	arr[0] = v
	h[key] = arr[:]
}

// reset drops references so a pooled message retains no payload.
func (o *outMsg) reset() {
	o.m.Subject, o.m.Reply, o.m.Data = "", "", nil
	o.id[0], o.path[0], o.from[0], o.present[0] = "", "", "", ""
}
