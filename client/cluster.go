package client

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/natsurl"
)

// DefaultGather is how long ClusterStatus collects the answers of coordinators and
// servers: each answers at once, so this only needs to cover a round trip.
const DefaultGather = 500 * time.Millisecond

// ClusterStatus is the state of a jobbus deployment as seen from one NATS connection.
type ClusterStatus struct {
	// Cluster is the connected server's cluster name ("" on a lone server).
	Cluster string `json:"cluster,omitempty"`
	// Connected is the server this connection is on (name, else URL).
	Connected string `json:"connected"`
	// URLs are the client URLs the cluster advertises, the connected one first.
	URLs []string `json:"urls"`
	// Servers are the embedded servers (jobbus serve) that answered, by name.
	Servers []protocol.Server `json:"servers,omitempty"`
	// Buckets are the KV buckets a coordinator opens (JOBBUS_LEADER, JOBS, TASK_TYPES)
	// with their replicas and currency.
	Buckets []BucketStatus `json:"buckets"`
	// Lease is the leader lease; nil when no coordinator holds it, or when it could not
	// be read (LeaseError says why).
	Lease      *Lease `json:"lease,omitempty"`
	LeaseError string `json:"lease_error,omitempty"`
	// Term is the leadership term in JOBS (protocol.TermKey): its number and the
	// coordinator that claimed it, which fences every create of the term.
	Term string `json:"term,omitempty"`
	// Coordinators are the coordinator processes that answered, leaders first.
	Coordinators []protocol.Coordinator `json:"coordinators"`
}

// BucketStatus is one KV bucket's replication.
type BucketStatus struct {
	Bucket   string `json:"bucket"`
	Replicas int    `json:"replicas"`
	// Leader is the server that leads its stream ("" on a lone server).
	Leader string `json:"leader,omitempty"`
	// Peers are its other replicas.
	Peers []protocol.Peer `json:"peers,omitempty"`
	// Messages is how many records it holds.
	Messages uint64 `json:"messages"`
	// Error says why it could not be read (it does not exist yet, say).
	Error string `json:"error,omitempty"`
}

// Lease is the leader lease as stored.
type Lease struct {
	Holder string `json:"holder"`
	// Renewed is when the holder last wrote it.
	Renewed time.Time `json:"renewed"`
}

// ClusterStatus reads the deployment nc reaches: the advertised servers, what the
// embedded servers and coordinators say of themselves (gathered for wait; 0 means
// DefaultGather), jobbus's buckets and the leader lease. It needs NATS, not the TCP port.
func ReadClusterStatus(ctx context.Context, nc *nats.Conn, wait time.Duration) (ClusterStatus, error) {
	if wait <= 0 {
		wait = DefaultGather
	}
	st := ClusterStatus{Cluster: nc.ConnectedClusterName(), Connected: cmp.Or(nc.ConnectedServerName(), natsurl.Connected(nc))}
	st.URLs = append(st.URLs, natsurl.Connected(nc))
	for _, u := range nc.DiscoveredServers() {
		if p, err := url.Parse(u); err == nil && !slices.ContainsFunc(st.URLs, func(s string) bool { return sameHost(s, p.Host) }) {
			st.URLs = append(st.URLs, u)
		}
	}
	// Ask both kinds of process at once, so the wait is paid once.
	servers, coords := make(chan []protocol.Server, 1), make(chan []protocol.Coordinator, 1)
	go func() { servers <- gather[protocol.Server](ctx, nc, protocol.ServersSubject, wait) }()
	go func() { coords <- gather[protocol.Coordinator](ctx, nc, protocol.CoordinatorsSubject, wait) }()

	js, err := jetstream.New(nc)
	if err != nil {
		return st, fmt.Errorf("cluster status: %w", err)
	}
	// JetStream answers nothing while its cluster lacks a majority: its reads get a
	// deadline of their own, so that what the servers and coordinators said is still
	// shown, and when it is needed most.
	jctx, cancel := context.WithTimeout(ctx, jetStreamWait)
	defer cancel()
	for _, b := range []string{protocol.LeaderBucket, protocol.JobsBucket, protocol.TaskTypesBucket} {
		st.Buckets = append(st.Buckets, bucketStatus(ctx, jctx, js, b))
	}
	st.Lease, st.LeaseError = readLease(ctx, jctx, js)
	if kv, err := js.KeyValue(jctx, protocol.JobsBucket); err == nil {
		if e, err := kv.Get(jctx, protocol.TermKey); err == nil {
			st.Term = string(e.Value())
		}
	}

	st.Servers = <-servers
	slices.SortFunc(st.Servers, func(a, b protocol.Server) int { return cmp.Compare(a.Name, b.Name) })
	st.Coordinators = <-coords
	slices.SortFunc(st.Coordinators, func(a, b protocol.Coordinator) int {
		return cmp.Or(cmp.Compare(a.State, b.State), cmp.Compare(a.ID, b.ID)) // "leading" < "standby"
	})
	// The cause says why the context ended (a publish NATS refused, say), where
	// ctx.Err() says only that it did.
	return st, context.Cause(ctx)
}

func sameHost(u, host string) bool {
	p, err := url.Parse(u)
	return err == nil && p.Host == host
}

// jetStreamWait bounds ReadClusterStatus's JetStream reads (nats.go's default API
// timeout).
const jetStreamWait = 5 * time.Second

// jsError words err, from a JetStream read under jctx within ctx: JetStream's silence is
// named as such.
func jsError(ctx, jctx context.Context, err error) string {
	if errors.Is(err, context.DeadlineExceeded) && jctx.Err() != nil && ctx.Err() == nil {
		return fmt.Sprintf("JetStream did not answer within %s (is a majority of its servers up?)", jetStreamWait)
	}
	return err.Error()
}

func bucketStatus(ctx, jctx context.Context, js jetstream.JetStream, bucket string) BucketStatus {
	b := BucketStatus{Bucket: bucket}
	s, err := js.Stream(jctx, "KV_"+bucket)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		b.Error = "does not exist (no coordinator has run)"
		return b
	}
	if err != nil {
		b.Error = jsError(ctx, jctx, err)
		return b
	}
	info := s.CachedInfo()
	b.Replicas, b.Messages = info.Config.Replicas, info.State.Msgs
	if c := info.Cluster; c != nil {
		b.Leader = c.Leader
		for _, p := range c.Replicas {
			b.Peers = append(b.Peers, protocol.Peer{Name: p.Name, Current: p.Current, Offline: p.Offline,
				ActiveMillis: p.Active.Milliseconds(), Lag: p.Lag})
		}
	}
	return b
}

// readLease reads the leader lease: nil and "" when nobody holds it, nil and why when it
// could not be read.
func readLease(ctx, jctx context.Context, js jetstream.JetStream) (*Lease, string) {
	kv, err := js.KeyValue(jctx, protocol.LeaderBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, ""
	}
	if err != nil {
		return nil, jsError(ctx, jctx, err)
	}
	e, err := kv.Get(jctx, protocol.LeaderKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, ""
	}
	if err != nil {
		return nil, jsError(ctx, jctx, err)
	}
	return &Lease{Holder: string(e.Value()), Renewed: e.Created()}, ""
}

// gather sends one request on subject and collects every reply that arrives within
// wait (or until ctx ends), skipping what does not decode.
func gather[T any](ctx context.Context, nc *nats.Conn, subject string, wait time.Duration) []T {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var out []T
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return out
		}
		var v T
		if len(m.Data) > 0 && json.Unmarshal(m.Data, &v) == nil {
			out = append(out, v)
		}
	}
}
