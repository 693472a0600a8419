package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// What keeps the job store from taking a write, as told to clients and operators. Each
// condition has its own words, and only a full or a read-only disk speaks of a disk: a
// stream electing its leader (seconds, after the server that led it went away) is not a
// disk fault, and an operator told "disk" looks in the wrong place.

// storeCondition is a cause a write failed for.
type storeCondition int

const (
	// condUnanswered: the write got no answer in time, and nothing more is known.
	condUnanswered storeCondition = iota
	// condDisconnected: this coordinator's NATS connection is down.
	condDisconnected
	// condElection: the stream has no leader, or got a new one while the write was in
	// flight, while a majority of its replicas is reachable: it is electing one.
	condElection
	// condNoQuorum: fewer than a majority of the stream's replicas are reachable.
	condNoQuorum
	// condNoMeta: JetStream's cluster has no meta leader: it answers no stream request.
	condNoMeta
	// condStoreFull: JetStream refused the write for its storage limit
	// (max_file_store, the account's, the stream's): not the disk.
	condStoreFull
	// condDiskFull: the disk under the store has no room (ENOSPC).
	condDiskFull
	// condReadOnly: the file system under the store is read-only (EROFS).
	condReadOnly
	// condStalled: writes go unanswered while the stream's settled leader answers:
	// what nats-server does once a write to a stream's files failed.
	condStalled
	// condRefused: JetStream refused the write for a reason of its own (a message
	// size limit, say), said in its words.
	condRefused
)

// diagnosis is a condition and what the coordinator saw of it.
type diagnosis struct {
	cond   storeCondition
	stream string // the stream asked about
	detail string // JetStream's or the system's words, or the replica count
}

// String says what is wrong in words for a client's ERROR and the operator's log.
func (d diagnosis) String() string {
	switch d.cond {
	case condDisconnected:
		return "this coordinator's connection to NATS is down; it is reconnecting"
	case condElection:
		return fmt.Sprintf("JetStream is electing a new leader for stream %s (its leading server went away); writes resume once one is elected, usually within seconds", d.stream)
	case condNoQuorum:
		return fmt.Sprintf("stream %s has lost its quorum (%s); writes resume once a majority of its servers is back", d.stream, d.detail)
	case condNoMeta:
		return "JetStream's cluster has no meta leader (electing one, or too few of its servers are reachable): " + d.detail
	case condStoreFull:
		return "the job store is full (JetStream: " + d.detail + ")"
	case condDiskFull:
		return "the job store's disk is full (" + d.detail + ")"
	case condReadOnly:
		return "the job store's disk is read-only (" + d.detail + ")"
	case condStalled:
		return fmt.Sprintf("stream %s takes no writes while its leader answers: its disk is likely full or read-only", d.stream)
	case condRefused:
		return "JetStream refused the write (" + d.detail + ")"
	}
	if d.detail != "" {
		return "the job store did not answer the write in time (" + d.detail + ")"
	}
	return "the job store did not answer the write in time"
}

// disk reports a condition of the disk under the store.
func (d diagnosis) disk() bool {
	return d.cond == condDiskFull || d.cond == condReadOnly || d.cond == condStalled
}

// JetStream's error codes (nats-server's errors.json) that a diagnosis reads.
const (
	codeClusterNotAvail jetstream.ErrorCode = 10008 // no meta leader
	codeStreamOffline   jetstream.ErrorCode = 10118 // every replica offline
)

// diagnoseError is what err alone says about the store, and whether it says enough.
func diagnoseError(err error) (diagnosis, bool) {
	var apiErr *jetstream.APIError
	api := errors.As(err, &apiErr)
	text := err.Error()
	switch {
	case StoreFull(err):
		return diagnosis{cond: condStoreFull, detail: apiErr.Description}, true
	case errors.Is(err, syscall.ENOSPC) || strings.Contains(text, syscall.ENOSPC.Error()):
		return diagnosis{cond: condDiskFull, detail: text}, true
	case errors.Is(err, syscall.EROFS) || strings.Contains(text, syscall.EROFS.Error()):
		return diagnosis{cond: condReadOnly, detail: text}, true
	case errors.Is(err, errStoreStalled):
		return diagnosis{cond: condStalled}, true
	case api && apiErr.ErrorCode == codeClusterNotAvail:
		return diagnosis{cond: condNoMeta, detail: apiErr.Description}, true
	case api && apiErr.ErrorCode == codeStreamOffline:
		return diagnosis{cond: condNoQuorum, detail: "every replica is offline"}, true
	case errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrConnectionClosed),
		errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrReconnectBufExceeded):
		return diagnosis{cond: condDisconnected}, true
	}
	return diagnosis{cond: condUnanswered}, false
}

// diagnoseStream says why a write to stream, sent at sent, failed with err: from the
// error when it says, else from the stream's cluster information, asked within 2 s.
func diagnoseStream(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, stream string, err error, sent time.Time) diagnosis {
	if d, ok := diagnoseError(err); ok {
		d.stream = stream
		return d
	}
	if nc != nil && !nc.IsConnected() {
		return diagnosis{cond: condDisconnected, stream: stream}
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return diagnosis{cond: condRefused, stream: stream, detail: apiErr.Error()}
	}
	timeout := timedOut(err)
	if !timeout && !noResponders(err) {
		return diagnosis{cond: condUnanswered, stream: stream, detail: err.Error()}
	}
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, ierr := js.Stream(ictx, stream)
	if ierr != nil {
		d, ok := diagnoseError(ierr)
		if !ok {
			// No member answered either: the stream is leaderless and its members are
			// busy electing, or unreachable.
			d = diagnosis{cond: condElection, detail: ierr.Error()}
		}
		d.stream = stream
		return d
	}
	return diagnoseInfo(stream, s.CachedInfo(), sent, timeout)
}

// noResponders reports a write no server took: no stream listened on its subject.
func noResponders(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

// diagnoseInfo reads a stream's information, taken after a write sent at sent went
// unanswered (timeout) or was taken by no server.
func diagnoseInfo(stream string, info *jetstream.StreamInfo, sent time.Time, timeout bool) diagnosis {
	d := diagnosis{cond: condStalled, stream: stream}
	ci := info.Cluster
	if ci == nil || info.Config.Replicas <= 1 {
		// A lone server elects nothing: a write it got and did not answer is stalled,
		// unless it went on storing writes well after this one was sent: a server that
		// stopped writing stores none after the first that failed (those in flight with
		// it land within moments), while one only slow to answer (a starved machine, an
		// answer lost) goes on. sent may be a second early (diagnoseWrite).
		switch {
		case !timeout:
			d.cond, d.detail = condUnanswered, "no server took it: JetStream was restarting, or off"
		case info.State.LastTime.After(sent.Add(2 * time.Second)):
			d.cond, d.detail = condUnanswered, "JetStream stored later writes meanwhile: the server is slow, not stalled"
		}
		return d
	}
	// A leader lists the other replicas; a member without a leader lists itself too.
	// Whoever answered is reachable.
	reachable, listed := 0, len(ci.Replicas)
	for _, p := range ci.Replicas {
		if !p.Offline {
			reachable++
		}
	}
	if ci.Leader != "" {
		reachable, listed = reachable+1, listed+1
	}
	replicas := max(info.Config.Replicas, listed)
	switch {
	case reachable*2 <= replicas:
		d.cond, d.detail = condNoQuorum, fmt.Sprintf("%d of its %d replicas reachable", reachable, replicas)
	case ci.Leader == "":
		d.cond = condElection
	case ci.LeaderSince != nil && ci.LeaderSince.After(sent.Add(-time.Second)), !timeout:
		// Elected while the write was in flight (a second's margin for clocks): the
		// write went to the leader before it. Or taken by no server though there is a
		// leader: its subscription was not there yet.
		d.cond = condElection
	default:
		// A settled leader with its quorum that did not confirm in time: slow, or
		// catching up after its quorum came back. A replica whose disk fails gives its
		// leadership up (nats-server), so this is not taken for a stalled disk.
		d.cond, d.detail = condUnanswered, "stream "+stream+"'s leader answers, and did not confirm it in time"
	}
	return d
}
