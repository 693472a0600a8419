package system

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/embeddednats"
)

// jobsStream is the stream under the coordinator's job bucket.
const jobsStream = "KV_" + protocol.JobsBucket

// storeRetry is how often Start tries again to start on a store it cannot write
// (NATS.WaitForStore), and storeSay how often it says it is still waiting.
const (
	storeRetry = 500 * time.Millisecond
	storeSay   = 30 * time.Second
)

// startNATS joins NATS.URL, or starts the embedded server and connects to it
// in-process.
func (s *System) startNATS(ctx context.Context) error {
	if s.cfg.NATS.URL != "" {
		var extra []nats.Option
		if s.cfg.Bridge != nil && !s.bridgeOwnConn() {
			extra = bridgeNATSOptions() // the bridge is the connection's main user
		}
		nc, err := s.dial(ctx, extra...)
		if err != nil {
			return err
		}
		s.nc, s.url = nc, s.cfg.NATS.URL
		s.onStop(nc.Close)
		return nil
	}
	dir := s.cfg.NATS.StoreDir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "jobbus-store-")
		if err != nil {
			return fmt.Errorf("system: temporary store: %w", err)
		}
		dir = tmp
		s.onStop(func() { _ = os.RemoveAll(tmp) })
	}
	srv, err := s.startServer(ctx, append(slices.Clone(s.cfg.NATS.Server), embeddednats.WithStoreDir(dir)))
	if err != nil {
		return err
	}
	// A configuration file's store_dir wins over dir: the coordinator's identity goes
	// with the store the server runs on.
	s.srv, s.url, s.dir = srv, srv.ClientURL(), srv.StoreDir()
	s.onStop(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			s.log.Warn("embedded NATS shutdown", "err", err)
		}
	})
	nc, err := srv.Connect(append([]nats.Option{nats.Name(s.cfg.NATS.Name)}, s.cfg.NATS.Options...)...)
	if err != nil {
		return fmt.Errorf("connect to embedded NATS: %w", err)
	}
	s.nc = nc
	s.onStop(nc.Close)
	if s.cfg.NATS.AnswerServers {
		s.onStop(answerServerInfo(nc, srv, s.log))
	}
	return nil
}

// storeDir is the embedded server's store directory.
func (s *System) storeDir() string { return s.dir }

// dial connects to NATS.URL as a long-running service and checks that it offers
// JetStream. It waits for NATS and its JetStream to answer (a system started with its
// cluster), then keeps reconnecting, to any server of the cluster, for as long as it
// runs.
func (s *System) dial(ctx context.Context, extra ...nats.Option) (*nats.Conn, error) {
	return embeddednats.Dial(ctx, s.cfg.NATS.URL,
		embeddednats.WithName(s.cfg.NATS.Name),
		embeddednats.WithWait(s.log),
		embeddednats.WithNATSOptions(embeddednats.ServiceOptions()...),
		embeddednats.WithNATSOptions(s.cfg.NATS.Options...),
		embeddednats.WithNATSOptions(extra...))
}

// startServer starts the embedded server. With NATS.WaitForStore, on a store
// directory it cannot write (a read-only file system, a full disk) it waits, saying
// so every storeSay, and starts once the directory takes writes: like a service that
// waits for its NATS server, it waits for its disk instead of exiting, and recovers
// by itself when an operator remounts or frees it.
func (s *System) startServer(ctx context.Context, opts []embeddednats.Option) (*embeddednats.Server, error) {
	var said time.Time
	for {
		srv, err := embeddednats.Start(ctx, opts...)
		if err == nil || !s.cfg.NATS.WaitForStore || !(errors.Is(err, embeddednats.ErrStoreReadOnly) || errors.Is(err, embeddednats.ErrStoreFull)) {
			if err == nil && !said.IsZero() {
				s.log.Info("the store takes writes: starting")
			}
			return srv, err
		}
		if time.Since(said) >= storeSay {
			s.log.Error("cannot start on this store; waiting until it takes writes", "err", err)
			said = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(storeRetry):
		}
	}
}

// answerServerInfo answers `jobbus cluster` for the embedded server srv on nc: its
// name, routes, leaf nodes and, on the JetStream meta leader, every peer's currency.
func answerServerInfo(nc *nats.Conn, srv *embeddednats.Server, log *slog.Logger) (stop func()) {
	sub, err := nc.Subscribe(protocol.ServersSubject, func(m *nats.Msg) {
		data, err := json.Marshal(serverInfo(srv))
		if err == nil {
			_ = m.Respond(data)
		}
	})
	if err != nil {
		log.Warn("server presence off: jobbus cluster will not list this server", "err", err)
		return func() {}
	}
	return func() { _ = sub.Unsubscribe() }
}

func serverInfo(srv *embeddednats.Server) protocol.Server {
	ns := srv.NATS()
	info := protocol.Server{Name: ns.Name(), Cluster: ns.ClusterName(), URL: srv.ClientURL(), JetStream: ns.JetStreamEnabled()}
	if rz, err := ns.Routez(nil); err == nil {
		for _, r := range rz.Routes {
			if r.RemoteName != "" && !slices.Contains(info.Routes, r.RemoteName) {
				info.Routes = append(info.Routes, r.RemoteName)
			}
		}
		slices.Sort(info.Routes)
	}
	if lz, err := ns.Leafz(nil); err == nil {
		for _, l := range lz.Leafs {
			if !slices.Contains(info.Leafnodes, l.Name) {
				info.Leafnodes = append(info.Leafnodes, l.Name)
			}
		}
		slices.Sort(info.Leafnodes)
	}
	if info.JetStream {
		if jz, err := ns.Jsz(&server.JSzOptions{}); err == nil && jz.Meta != nil {
			info.MetaLeader = jz.Meta.Leader
			for _, p := range jz.Meta.Replicas {
				info.Peers = append(info.Peers, protocol.Peer{Name: p.Name, Current: p.Current, Offline: p.Offline,
					ActiveMillis: p.Active.Milliseconds(), Lag: p.Lag})
			}
		}
	}
	return info
}
