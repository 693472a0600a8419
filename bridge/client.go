package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
	"github.com/jobbus/jobbus/internal/natsreq"
)

// verdict is what the client port does with a frame.
type verdict int

const (
	// forward sends the payload to the coordinator and writes its reply back.
	forward verdict = iota
	// answer writes an ERROR and keeps the connection: the frame was well formed.
	answer
	// reject writes a best-effort ERROR and closes: the peer's bytes cannot be trusted.
	reject
)

func (v verdict) String() string {
	switch v {
	case forward:
		return "forward"
	case answer:
		return "answer"
	case reject:
		return "reject"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// classifyClient decides what to do with one client-port payload: forward it to the
// subject of its endpoint, or answer (and maybe close) with the ERROR returned. A
// client request is forwarded on its type alone, undecoded: the coordinator decodes it
// anyway, and its answer says whether it could; when it does not vouch for the
// payload, malformed judges it (serveClient). Anything else is decoded here.
func classifyClient(payload []byte) (verdict, string, *protocol.Error) {
	t, err := protocol.PeekType(payload)
	if err != nil {
		// Decode's own error: it reads the type with PeekType first.
		return reject, "", protocol.MalformedRequest(err)
	}
	if subject, ok := protocol.SubjectFor(t); ok {
		return forward, subject, nil
	}
	if e := malformed(payload); e != nil {
		return reject, "", e
	}
	return answer, "", protocol.UnexpectedType(t, "client")
}

// malformed is the ERROR for a payload Decode rejects, nil for one it accepts.
func malformed(payload []byte) *protocol.Error {
	if _, err := protocol.Decode(payload); err != nil {
		return protocol.MalformedRequest(err)
	}
	return nil
}

// serveClient runs one client-port connection: read a request, forward it, write the
// reply, and only then read the next one; but a submission that arrives while replies
// are still to be written, or behind which more bytes wait already, is forwarded at
// once and its reply written in turn (ahead.go).
func (b *Bridge) serveClient(c net.Conn, release func()) {
	defer release()
	log := b.log.With("port", "client", "remote", c.RemoteAddr().String())
	log.Debug("client connected")
	p := &pipe{b: b, c: c, log: log}
	r := frame.NewReader(c)
	var rdl deadline
	linger := false // close c only once the replies in flight are written
	defer func() {
		p.close()
		if linger {
			lingerClose(c, b.cfg.FrameStallTimeout)
		}
	}()
	for {
		payload, err := readFrame(c, r, &rdl, b.cfg.FrameStallTimeout)
		if err != nil {
			b.readFailed(log, err, "client", func(data []byte) {
				if p.busy() {
					p.answer(data)
				} else {
					_ = writeFrame(c, data, b.cfg.WriteTimeout)
				}
				linger = true
			})
			return
		}
		v, subject, e := classifyClient(payload)
		if v == forward && subject == submitSubject && len(payload) <= aheadFrame && (p.busy() || r.Started()) {
			// Judged before it is forwarded, as a reply that does not vouch for it would
			// be judged below: nothing behind a malformed frame may be forwarded.
			if e = malformed(payload); e == nil {
				p.add(payload)
				if !r.Started() {
					p.dispatch() // nothing more to gather: forward what was
				}
				if b.ctx.Err() != nil {
					linger = true
					return
				}
				continue
			}
			v = reject
		}
		p.drain()
		var reply []byte
		if v == forward {
			var decoded bool
			reply, decoded, e = b.request(subject, payload, log)
			if subject == submitManySubject && e == nil && decoded {
				reply = b.settleBatch(payload, reply, log) // ahead.go
			}
			if !decoded {
				// The coordinator did not vouch for the payload: it refused it (maybe as
				// malformed), or did not answer. Judge it here, as the bridge did before
				// it forwarded requests undecoded, so that a malformed frame gets the
				// same ERROR and closes the connection whatever the coordinator could say.
				if me := malformed(payload); me != nil {
					v, reply, e = reject, nil, me
				}
			}
		}
		switch v {
		case reject:
			b.stats.malformed("client")
			log.Info("malformed request; closing", "err", e.Message)
		}
		if e != nil {
			reply = encodeError(e)
		}
		if p.wbuf, err = writeFrameBuf(c, &p.wdl, p.wbuf, reply, b.cfg.WriteTimeout); err != nil {
			log.Info("client dropped: write failed", "err", err)
			return
		}
		if v == reject || b.ctx.Err() != nil {
			linger = true
			return
		}
	}
}

// readFailed handles the error that ends a connection's reading: a clean close, a
// broken or stalled frame (closed without a word), or a bad length prefix, whose
// best-effort ERROR goes to last, which writes it and closes the connection.
func (b *Bridge) readFailed(log *slog.Logger, err error, port string, last func([]byte)) {
	b.stats.frameError(port, err)
	switch {
	case errors.Is(err, io.EOF):
		log.Debug(port + " closed the connection")
	case errors.Is(err, frame.ErrBadLength), errors.Is(err, frame.ErrTooLarge):
		log.Info("bad frame length; closing", "err", err)
		last(encodeError(protocol.MalformedRequest(err)))
	case errors.Is(err, errStalled):
		log.Info("frame stalled; closing", "err", err)
	case b.ctx.Err() != nil || errors.Is(err, net.ErrClosed):
		// We closed it: the bridge is stopping or the session ended it.
	default:
		log.Info(port+" connection broken", "err", err)
	}
}

// request forwards a payload to the coordinator's API and returns the reply body, or
// the ERROR to answer instead. decoded reports that the reply is the coordinator's
// answer to the request it decoded: the coordinator flags every ERROR it answers (with
// micro's error header), and it answers anything else only to a request it decoded.
func (b *Bridge) request(subject string, payload []byte, log *slog.Logger) (reply []byte, decoded bool, e *protocol.Error) {
	var rid string // a submission's: it names the job, for an "Outcome unknown"
	if subject == submitSubject {
		if e := oversizedSubmission(payload); e != nil {
			return nil, false, e
		}
		rid = protocol.NewRequestID()
	}
	msg, e, err := b.forward(subject, payload, rid, nil, log)
	if errors.Is(err, nats.ErrMaxPayload) {
		// Refused by the connection before it was sent, so nothing was stored: a frame
		// near the 1 MiB maximum does not fit in a NATS message with the request's
		// headers. Fields no message defines, which the spec says to ignore, can make
		// it that large; without them it may fit.
		if lean := withoutUnknownFields(payload); lean != nil {
			msg, e, err = b.forward(subject, lean, rid, nil, log)
		}
	}
	switch {
	case e != nil:
		return nil, false, e
	case errors.Is(err, nats.ErrMaxPayload):
		// Refused by the connection before it was sent: surely nothing was stored.
		return nil, false, errTooLargeToForward(len(payload), b.nc.MaxPayload())
	case err != nil:
		var jobID string
		if rid != "" {
			jobID = protocol.RequestJobID(rid)
		}
		return nil, false, b.unavailable(subject, jobID, err)
	}
	reply, e = checkReply(msg, log)
	return reply, e == nil && msg.Header.Get(micro.ErrorHeader) == "", e
}

// withoutUnknownFields is payload, a request, encoded again without the fields no
// message defines, when that makes it shorter; nil otherwise (it does not decode, or
// has no such fields to drop).
func withoutUnknownFields(payload []byte) []byte {
	m, err := protocol.Decode(payload)
	if err != nil {
		return nil
	}
	lean, err := protocol.Encode(m)
	if err != nil || len(lean) >= len(payload) {
		return nil
	}
	return lean
}

// oversizedSubmission is the coordinator's ERROR for a SUBMIT_JOB whose payload
// exceeds protocol.MaxPayloadBytes, said here: a frame that large may not fit in a NATS
// message with the request's headers, and the client is owed the coordinator's answer.
// Only frames that large are decoded.
func oversizedSubmission(payload []byte) *protocol.Error {
	if len(payload) <= protocol.MaxPayloadBytes {
		return nil
	}
	if m, err := protocol.Decode(payload); err == nil {
		if sub, ok := m.(*protocol.SubmitJob); ok && len(sub.Payload) > protocol.MaxPayloadBytes {
			return sub.CheckSubmission()
		}
	}
	return nil
}

// forward sends payload to the coordinator on subject and returns its reply. refused
// is the ERROR to answer when the bridge did not send it (it is stopping, or its NATS
// connection is down); err is natsreq's when no reply came.
func (b *Bridge) forward(subject string, payload []byte, rid string, h nats.Header, log *slog.Logger) (msg *nats.Msg, refused *protocol.Error, err error) {
	select {
	case b.requests <- struct{}{}:
	case <-b.ctx.Done():
		return nil, errShuttingDown(), nil
	}
	defer func() { <-b.requests }()
	if e := b.connDown(); e != nil {
		// Answer now rather than after RequestTimeout: nothing can reach the
		// coordinator, and a request buffered by the connection would be sent after
		// the client already got its ERROR.
		log.Debug("request refused: NATS connection down", "subject", subject)
		return nil, e, nil
	}
	// Sent again while no coordinator serves its subject (one is starting, or failing
	// over), and as natsreq.Request says: the TCP client hears one reply, only later. A
	// submission's request id names the job it creates, for an "Outcome unknown".
	// Within bounds the request as a context.WithTimeout of b.ctx would (the same
	// deadline, the same errors), without a context and a timer of its own per request:
	// natsreq then arms only each send's wait.
	opts := natsreq.Options{WaitForResponders: true, Within: b.cfg.RequestTimeout, RequestID: rid, Header: h}
	msg, err = natsreq.Request(b.ctx, b.nc, subject, payload, opts)
	if err != nil {
		log.Debug("request failed", "subject", subject, "err", err)
	}
	return msg, nil, err
}

var (
	submitSubject, _     = protocol.SubjectFor(protocol.TypeSubmitJob)
	submitManySubject, _ = protocol.SubjectFor(protocol.TypeSubmitJobs)
)

// checkReply vets a reply body before it is written as a frame unchanged.
func checkReply(msg *nats.Msg, log *slog.Logger) ([]byte, *protocol.Error) {
	switch n := len(msg.Data); {
	case n == 0:
		// A micro service error (no body, the text in a header), never the coordinator's
		// own answer, which is always a message.
		text := msg.Header.Get(micro.ErrorHeader)
		if text == "" {
			text = "empty reply"
		}
		log.Warn("coordinator sent no reply body", "subject", msg.Subject, "err", text)
		return nil, &protocol.Error{Message: "coordinator error: " + text}
	case n > frame.MaxSize:
		log.Warn("reply exceeds the frame limit; answering ERROR instead", "subject", msg.Subject, "bytes", n, "max", frame.MaxSize)
		return nil, errReplyTooLarge(n)
	}
	return msg.Data, nil
}

// unavailable is the ERROR for a request no coordinator answered. A submission or a
// cancel that was sent may have been acted on: its ERROR says "Outcome unknown", never
// what would mean "nothing stored" (coordinator/outcome.go).
func (b *Bridge) unavailable(subject, jobID string, err error) *protocol.Error {
	if what := writeRequest(subject); what != "" && !errors.Is(err, nats.ErrNoResponders) &&
		!errors.Is(err, nats.ErrConnectionReconnecting) {
		cause := "no reply from the coordinator within " + b.cfg.RequestTimeout.String()
		var refused *natsreq.RefusedError
		if b.ctx.Err() != nil {
			cause = "the bridge stopped before the coordinator replied"
		} else if errors.As(err, &refused) || (!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout)) {
			cause = "the request to the coordinator failed: " + err.Error()
		}
		if jobID != "" { // the job its request id names (failover.go)
			return protocol.OutcomeUnknown(what, jobID, cause)
		}
		return protocol.OutcomeUnknownUnanswered(what, cause)
	}
	switch {
	case b.ctx.Err() != nil:
		return errShuttingDown()
	case errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrReconnectBufExceeded),
		errors.Is(err, nats.ErrConnectionClosed):
		return errNATSDown()
	case errors.Is(err, nats.ErrNoResponders):
		return errUnavailable("no coordinator is serving " + subject)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return errUnavailable(fmt.Sprintf("no reply within %v", b.cfg.RequestTimeout))
	}
	return errUnavailable(err.Error())
}

// writeRequest names the request an API subject takes when it may store something
// ("submission", "cancel"), "" otherwise.
func writeRequest(subject string) string {
	switch t, _ := protocol.RequestOn(subject); t {
	case protocol.TypeSubmitJob:
		return "submission"
	case protocol.TypeSubmitJobs:
		return "batch of submissions"
	case protocol.TypeCancelJob:
		return "cancel"
	}
	return ""
}

// connDown is the ERROR for a request while the bridge's own NATS connection is not
// connected, nil while it is.
func (b *Bridge) connDown() *protocol.Error {
	if b.nc.IsConnected() {
		return nil
	}
	return errNATSDown()
}
