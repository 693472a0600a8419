package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const leaderKey = "coordinator"

// Run campaigns for leadership and runs a coordinator while it leads, until ctx ends:
// several `jobbus coordinator` processes on one NATS give one leader and standbys that
// take over within a lease of its loss. onLead, if not nil, sees each coordinator started.
//
// Leadership alone does not make writes safe (a deposed leader may not know it yet);
// the CAS on every record does (invariant 3). The lease only keeps the leader unique in
// the common case, and gives failover.
func Run(ctx context.Context, nc *nats.Conn, cfg Config, onLead func(*Coordinator)) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("coordinator config: %w", err)
	}
	cfg.fill()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("coordinator: jetstream: %w", err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: protocol.LeaderBucket, Description: "jobbus coordinator leader lease",
		History: 1, TTL: cfg.LeaderLease, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("coordinator: open bucket %s: %w", protocol.LeaderBucket, err)
	}
	id := cfg.ID
	if id == "" {
		id = newID()
	}
	for {
		rev, err := campaign(ctx, kv, id, cfg.LeaderLease/3, cfg.Logger)
		if err != nil {
			return nil // ctx ended while standing by
		}
		cfg.Logger.Info("leading", "coordinator", id)
		if err := lead(ctx, nc, kv, cfg, id, rev, onLead); err != nil {
			cfg.Logger.Error("lost leadership", "coordinator", id, "err", err)
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// campaign waits until this process holds the lease, or ctx ends. A lease that
// already names id was left by this coordinator before a crash: it is taken back at
// once.
func campaign(ctx context.Context, kv jetstream.KeyValue, id string, every time.Duration, log *slog.Logger) (uint64, error) {
	for said := false; ; {
		// ErrKeyExists means another leads; any other error (NATS unavailable, say) is
		// retried the same way, since the leader may be gone too.
		rev, err := kv.Create(ctx, leaderKey, []byte(id))
		if err == nil {
			return rev, nil
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			if rev, ok := takeBack(ctx, kv, id); ok {
				log.Info("taking back this coordinator's own lease", "coordinator", id)
				return rev, nil
			}
		}
		if !said {
			log.Info("standing by: another coordinator leads", "coordinator", id, "reason", err)
			said = true
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(every):
		}
	}
}

// lead runs a coordinator while the lease is renewed; it returns when ctx ends or the
// coordinator is fenced (giving the lease up either way), when another coordinator
// holds the lease, or when renewals have failed for half a lease.
func lead(ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue, cfg Config, id string, rev uint64, onLead func(*Coordinator)) error {
	c, err := New(nc, cfg)
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	defer c.Close()
	if onLead != nil {
		onLead(c)
	}
	t := time.NewTicker(cfg.LeaderLease / 3)
	defer t.Stop()
	renewed := time.Now()
	giveUp := func() { // after the coordinator stopped, so no standby overlaps it
		c.Close()
		_ = kv.Delete(context.Background(), leaderKey, jetstream.LastRevision(rev))
	}
	for {
		select {
		case <-ctx.Done():
			giveUp()
			return nil
		case <-c.Fenced():
			// Holding the lease while serving nothing would stall every standby.
			giveUp()
			return errors.New("fenced: stepping down, to lead again from the stored state")
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, cfg.LeaderLease/3)
			next, err := renew(rctx, kv, id, rev)
			cancel()
			switch {
			case err == nil:
				rev, renewed = next, time.Now()
			case ctx.Err() != nil:
			case errors.Is(err, errLeaseLost):
				return err
			case time.Since(renewed) >= cfg.LeaderLease/2:
				// Step down well before the lease can expire under a standby.
				return fmt.Errorf("renew lease: %w", err)
			default:
				// One missed renewal (a NATS blip, a pause) does not cost the
				// lease, nor the attempts of every running job a new leader
				// would count.
				cfg.Logger.Warn("lease renewal failed; retrying", "coordinator", id, "err", err)
			}
		}
	}
}

// takeBack renews a lease that names id, at the revision read: the CAS keeps it from
// taking a lease that changed hands meanwhile.
func takeBack(ctx context.Context, kv jetstream.KeyValue, id string) (uint64, bool) {
	e, err := kv.Get(ctx, leaderKey)
	if err != nil || string(e.Value()) != id {
		return 0, false
	}
	rev, err := kv.Update(ctx, leaderKey, []byte(id), e.Revision())
	return rev, err == nil
}

// errLeaseLost means the lease is gone or names another coordinator.
var errLeaseLost = errors.New("lease lost to another coordinator")

// renew extends the lease written at rev. An entry moved past rev that still names id
// is a renewal whose acknowledgement was lost: it is renewed at its own revision.
func renew(ctx context.Context, kv jetstream.KeyValue, id string, rev uint64) (uint64, error) {
	next, err := kv.Update(ctx, leaderKey, []byte(id), rev)
	if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return next, err
	}
	e, gerr := kv.Get(ctx, leaderKey)
	switch {
	case errors.Is(gerr, jetstream.ErrKeyNotFound), gerr == nil && string(e.Value()) != id:
		return 0, fmt.Errorf("%w: %w", errLeaseLost, err)
	case gerr != nil:
		return 0, gerr
	}
	return kv.Update(ctx, leaderKey, []byte(id), e.Revision())
}
