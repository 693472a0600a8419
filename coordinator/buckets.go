package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/internal/startup"
)

// ErrReplicasDiffer means a bucket exists with another replica count than the one asked
// for: changing it moves data between servers, so it is done only when asked
// (Config.ReconfigureBuckets, --reconfigure-buckets).
var ErrReplicasDiffer = errors.New("bucket exists with another replica count")

// ErrLeaseDiffers means the leader lease bucket exists with another TTL (lease) than
// the one asked for. Every coordinator must run with the bucket's lease: one with a
// longer lease renews less often than the lease lasts and loses it between renewals.
// So it is changed only when asked (Config.ReconfigureBuckets, --reconfigure-buckets).
var ErrLeaseDiffers = errors.New("bucket exists with another leader lease")

// DefaultClusterReplicas is the replica count of a bucket created in a cluster when
// Config.Replicas is 0 (or the cluster's size, if smaller).
const DefaultClusterReplicas = 3

// JetStream API error codes that no wait cures (nats-server's errors.json).
const (
	errCodeReplicasNotSupported = 10074 // replicas > 1 not supported in non-clustered mode
	errCodeInvalidConfig        = 10052 // stream configuration invalid
	errCodeNoPeers              = 10005 // no suitable peers for placement
	errCodeInsufficient         = 10023 // insufficient resources
)

// OpenBucket opens the KV bucket kvc describes, creating it if missing, and waits (with
// backoff, logging what it waits for) while JetStream does not answer: a coordinator
// started together with its cluster waits for the cluster instead of exiting.
//
// kvc.Replicas is ignored; the count is cfg.Replicas, or when that is 0 the count of an
// existing bucket, else DefaultClusterReplicas in a cluster (the cluster's size if
// smaller) and 1 on a lone server. An existing bucket keeps its replica count: asked for
// another one it is refused with ErrReplicasDiffer unless cfg.ReconfigureBuckets, and
// so is another TTL (the leader lease, the only bucket with one) with ErrLeaseDiffers.
// Its other settings (markers, description, a limit in kvc.MaxBytes) are brought up to
// date, as before; kvc.MaxBytes 0 keeps the bucket's limit, and one JetStream cannot
// reserve is not set (roomRefused).
func OpenBucket(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, cfg Config, kvc jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	log := cfg.Logger
	var kv jetstream.KeyValue
	warn := noPeersWarning{start: time.Now()}
	err := startup.Wait(ctx, log, "JetStream bucket "+kvc.Bucket, func(ctx context.Context) error {
		var err error
		kv, err = openBucketOnce(ctx, nc, js, cfg, kvc)
		if kvc.MaxBytes > 0 && roomRefused(err) {
			log.Warn("the bucket is not limited: JetStream cannot reserve its limit (max bytes) for other streams' limits, or a server with less room; "+
				"at the store's cap JetStream then refuses the leader lease's renewal too, and the coordinator stops serving until there is room",
				"bucket", kvc.Bucket, "max_bytes", kvc.MaxBytes, "err", err)
			kvc.MaxBytes = 0
			kv, err = openBucketOnce(ctx, nc, js, cfg, kvc)
		}
		warn.check(log, nc, cfg, kvc.Bucket, err)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", kvc.Bucket, err)
	}
	return kv, nil
}

// noPeersAfter is how long JetStream may find no servers for a bucket's replicas
// before OpenBucket warns: a cluster still forming does that for a few seconds.
const noPeersAfter = 5 * time.Second

// noPeersWarning warns once that a bucket waits for more servers than JetStream finds.
// More replicas than the cluster has look just like a cluster still starting, so the
// wait goes on; the warning says what to check.
type noPeersWarning struct {
	start  time.Time
	warned bool
}

func (w *noPeersWarning) check(log *slog.Logger, nc *nats.Conn, cfg Config, bucket string, err error) {
	if w.warned || !isAPIError(err, errCodeNoPeers) || time.Since(w.start) < noPeersAfter {
		return
	}
	w.warned = true
	asked := cfg.Replicas
	if asked == 0 {
		asked = autoReplicas(nc)
	}
	log.Warn("still waiting: JetStream finds too few servers for the bucket's replicas; check --replicas "+
		"(at most the cluster's JetStream servers) and that every node's routes reach the others (jobbus cluster lists them)",
		"bucket", bucket, "replicas", asked, "waited", time.Since(w.start).Round(time.Second), "err", err)
}

func openBucketOnce(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, cfg Config, kvc jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	s, err := js.Stream(ctx, "KV_"+kvc.Bucket)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return createBucket(ctx, nc, js, cfg, kvc)
	case err != nil:
		return nil, classify(err)
	}
	have := s.CachedInfo().Config.Replicas
	kvc.Replicas = have
	switch want := cfg.Replicas; {
	case want == 0 || want == have:
		if want == 0 {
			if def := autoReplicas(nc); have < def {
				cfg.Logger.Warn("bucket has fewer replicas than the cluster could give it; a lost server may lose it (change with --replicas N --reconfigure-buckets)",
					"bucket", kvc.Bucket, "replicas", have, "cluster_default", def)
			}
		}
	case cfg.ReconfigureBuckets:
		cfg.Logger.Warn("changing the bucket's replica count (--reconfigure-buckets)", "bucket", kvc.Bucket, "from", have, "to", want)
		kvc.Replicas = want
	default:
		return nil, startup.Permanent(fmt.Errorf("%w: %s has %d replicas, this coordinator asks for %d "+
			"(start it with --replicas %d, or 0 to keep what exists; or give --reconfigure-buckets to change the bucket)",
			ErrReplicasDiffer, kvc.Bucket, have, want, have))
	}
	if have := s.CachedInfo().Config.MaxAge; have != kvc.TTL {
		if !cfg.ReconfigureBuckets {
			return nil, startup.Permanent(fmt.Errorf("%w: %s has a lease (TTL) of %v, this coordinator asks for %v; every coordinator must use the same "+
				"(start it with --leader-lease-millis %d; or give --reconfigure-buckets to change the bucket, then restart every coordinator with the new lease)",
				ErrLeaseDiffers, kvc.Bucket, have, kvc.TTL, have.Milliseconds()))
		}
		cfg.Logger.Warn("changing the bucket's lease (--reconfigure-buckets): restart every coordinator with the new lease", "bucket", kvc.Bucket, "from", have, "to", kvc.TTL)
	}
	if kvc.MaxBytes == 0 {
		kvc.MaxBytes = s.CachedInfo().Config.MaxBytes // no limit asked for: keep the bucket's
	}
	if !differs(s.CachedInfo().Config, kvc) {
		// No update to wait for: a cluster still catching up after a restart answers
		// a read long before it commits a change.
		kv, err := js.KeyValue(ctx, kvc.Bucket)
		return kv, classify(err)
	}
	kv, err := js.UpdateKeyValue(ctx, kvc)
	if err != nil {
		return nil, classify(fmt.Errorf("update settings: %w", err))
	}
	return kv, nil
}

// differs reports whether the settings jobbus gives a bucket differ from its stream's.
func differs(sc jetstream.StreamConfig, kvc jetstream.KeyValueConfig) bool {
	history := max(int64(kvc.History), 1)
	return sc.Description != kvc.Description || sc.MaxMsgsPerSubject != history || sc.MaxAge != kvc.TTL ||
		sc.Storage != kvc.Storage || sc.Replicas != kvc.Replicas || sc.SubjectDeleteMarkerTTL != kvc.LimitMarkerTTL ||
		sc.AllowMsgTTL != (kvc.LimitMarkerTTL > 0) || sc.MaxBytes != kvc.MaxBytes
}

// createBucket creates a missing bucket. With no replica count given, a cluster gets
// DefaultClusterReplicas; where the cluster cannot place that many (it is smaller),
// as many as it has servers.
func createBucket(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, cfg Config, kvc jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kvc.Replicas = cfg.Replicas
	auto := kvc.Replicas == 0
	if auto {
		kvc.Replicas = autoReplicas(nc)
	}
	kv, err := js.CreateKeyValue(ctx, kvc)
	if auto && kvc.Replicas > 1 && (isAPIError(err, errCodeNoPeers) || isAPIError(err, errCodeInsufficient)) {
		if n := clusterSize(nc); n < kvc.Replicas {
			cfg.Logger.Info("cluster smaller than the default replica count", "bucket", kvc.Bucket, "servers", n, "replicas", n)
			kvc.Replicas = n
			kv, err = js.CreateKeyValue(ctx, kvc)
		}
	}
	if err != nil {
		// A bucket another coordinator created meanwhile is checked on the next try.
		return nil, classify(fmt.Errorf("create with %d replicas: %w", kvc.Replicas, err))
	}
	cfg.Logger.Info("bucket created", "bucket", kvc.Bucket, "replicas", kvc.Replicas)
	return kv, nil
}

// autoReplicas is the replica count of a bucket created without one: 1 on a lone
// server, DefaultClusterReplicas in a cluster.
func autoReplicas(nc *nats.Conn) int {
	if nc == nil || nc.ConnectedClusterName() == "" {
		return 1
	}
	return DefaultClusterReplicas
}

// clusterSize counts the servers of the connected cluster that clients may reach: the
// connected one and those the cluster advertised (INFO connect_urls). A cluster that
// hides its URLs (no_advertise) counts as DefaultClusterReplicas.
func clusterSize(nc *nats.Conn) int {
	if nc == nil || nc.ConnectedClusterName() == "" {
		return 1
	}
	hosts := map[string]bool{}
	if u, err := url.Parse(nc.ConnectedUrl()); err == nil {
		hosts[u.Host] = true
	}
	for _, s := range nc.DiscoveredServers() {
		s = strings.TrimPrefix(strings.TrimPrefix(s, "nats://"), "tls://")
		hosts[s] = true
	}
	if len(hosts) < 2 {
		return DefaultClusterReplicas
	}
	return len(hosts)
}

// classify marks the errors no wait cures as permanent; the rest (timeouts, no
// responders, a cluster still electing its leaders) are waited out.
func classify(err error) error {
	switch {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount),
		errors.Is(err, jetstream.ErrInvalidBucketName), errors.Is(err, nats.ErrConnectionClosed),
		isAPIError(err, errCodeReplicasNotSupported), isAPIError(err, errCodeInvalidConfig):
		return startup.Permanent(err)
	}
	return err
}

// roomRefused reports a bucket's limit (max bytes) that JetStream refused: it reserves
// a stream's limit from its servers' storage, and other streams reserved too much, or
// (in a cluster, where the limit comes from one server's cap) a server has less room.
func roomRefused(err error) bool {
	var apiErr *jetstream.APIError
	return isAPIError(err, codeStorageResourcesExceeded) || isAPIError(err, errCodeInsufficient) ||
		isAPIError(err, errCodeNoPeers) && errors.As(err, &apiErr) && strings.Contains(apiErr.Description, "insufficient storage")
}

func isAPIError(err error, code jetstream.ErrorCode) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == code
}
