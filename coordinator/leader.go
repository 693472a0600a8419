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
// take over as soon as its lease expires. onLead, if not nil, sees each coordinator
// started.
//
// The lease keeps the leader unique in the common case and gives failover; what makes
// a paused, deposed leader harmless is the term that fences its writes (batch.go) and
// its lease clock, which stops it answering (leaseclock.go).
func Run(ctx context.Context, nc *nats.Conn, cfg Config, onLead func(*Coordinator)) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("coordinator config: %w", err)
	}
	cfg.fill()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("coordinator: jetstream: %w", err)
	}
	// Expiry leaves a marker, which a standby's watch sees at once (campaign).
	// OpenBucket (buckets.go) waits for the cluster and checks the replica count.
	kv, err := OpenBucket(ctx, nc, js, cfg, jetstream.KeyValueConfig{
		Bucket: protocol.LeaderBucket, Description: "jobbus coordinator leader lease",
		History: 1, TTL: cfg.LeaderLease, Storage: jetstream.FileStorage,
		LimitMarkerTTL: max(cfg.LeaderLease, time.Second), // JetStream's least
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for the cluster
		}
		return fmt.Errorf("coordinator: %w", err)
	}
	if cfg.ID == "" {
		cfg.ID = newID()
	}
	e := &elector{nc: nc, kv: kv, cfg: cfg, log: cfg.Logger, onLead: onLead}
	return e.run(ctx)
}

// elector campaigns for the leader lease and, while it holds it, runs a coordinator,
// as River's internal/leadership does: a follower state (campaign) and a leader state
// (lead), one after the other until its context ends. It owns the lease bucket, the
// lease it holds (renewed by keepLease, which tells the coordinator's lease clock) and
// the presence that answers jobbus cluster.
type elector struct {
	nc     *nats.Conn
	kv     jetstream.KeyValue // protocol.LeaderBucket
	cfg    Config
	log    *slog.Logger
	onLead func(*Coordinator)
}

// run alternates standing by and leading until ctx ends.
func (e *elector) run(ctx context.Context) error {
	p := startPresence(e.nc, e.cfg.ID, e.log) // presence.go: for jobbus cluster
	defer p.close()
	for {
		l, err := e.campaign(ctx)
		if err != nil {
			return nil // ctx ended while standing by
		}
		e.log.Info("leading", "coordinator", e.cfg.ID)
		p.set(protocol.CoordinatorLeading)
		err = e.lead(ctx, l)
		p.set(protocol.CoordinatorStandby)
		if err != nil {
			e.log.Error("lost leadership", "coordinator", e.cfg.ID, "err", err)
		}
		e.cfg.fullRecovery = errors.Is(err, errFenced)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// lease is a leader lease held: its revision, and when the request that wrote it was
// sent (the lease runs from no earlier).
type lease struct {
	rev  uint64
	sent time.Time
}

// campaign waits until this process holds the lease, or ctx ends. A lease that
// already names id was left by this coordinator before a crash: it is taken back at
// once. Otherwise it watches the lease and tries again as soon as it is deleted or
// expires, and every `every` in any case.
func (e *elector) campaign(ctx context.Context) (lease, error) {
	kv, id, every, log := e.kv, e.cfg.ID, e.cfg.LeaderLease/3, e.log
	var gone <-chan jetstream.KeyValueEntry
	if w, err := kv.Watch(ctx, leaderKey, jetstream.UpdatesOnly()); err == nil {
		defer func() { _ = w.Stop() }()
		gone = w.Updates()
	}
	for said := false; ; {
		// ErrKeyExists means another leads; any other error (NATS unavailable, say) is
		// retried the same way, since the leader may be gone too.
		sent := time.Now()
		rev, err := kv.Create(ctx, leaderKey, []byte(id))
		if err == nil {
			return lease{rev, sent}, nil
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			if l, ok := e.takeBack(ctx); ok {
				log.Info("taking back this coordinator's own lease", "coordinator", id)
				return l, nil
			}
		}
		if !said {
			log.Info("standing by: another coordinator leads", "coordinator", id, "reason", err)
			said = true
		}
		if err := waitLeaseGone(ctx, gone, every); err != nil {
			return lease{}, err
		}
	}
}

// waitLeaseGone returns when the watched lease is deleted or expires, or after every.
func waitLeaseGone(ctx context.Context, gone <-chan jetstream.KeyValueEntry, every time.Duration) error {
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		case e, ok := <-gone:
			if !ok {
				return nil
			}
			if e != nil && e.Operation() != jetstream.KeyValuePut {
				return nil
			}
		}
	}
}

// lead runs a coordinator while it holds the lease, on a connection of its own: when
// it stops, closing that connection withdraws every subscription it had, even in the
// middle of a reconnect (a drained micro service re-subscribes on reconnect and leaves
// subscriptions nobody reads). It returns when ctx ends or the coordinator is fenced
// (giving the lease up either way), or when another coordinator holds the lease. Failed
// renewals alone do not end it: while the lease is not certainly held the coordinator
// answers nothing (leaseclock.go), and once a renewal gets through, nobody else took
// over.
func (e *elector) lead(ctx context.Context, l lease) error {
	kv, cfg := e.kv, e.cfg
	tnc, err := e.nc.Opts.Connect()
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer tnc.Close()
	c, err := New(tnc, cfg)
	if err != nil {
		return err
	}
	c.RenewedLease(l.sent, cfg.LeaderLease)
	// Renewals start before recovery, which may outlast a lease on a large store.
	rctx, stopRenewing := context.WithCancel(ctx)
	ended := make(chan leaseEnd, 1)
	go func() { ended <- e.keepLease(rctx, c, l) }()
	var end *leaseEnd
	stop := func() leaseEnd {
		if end == nil {
			stopRenewing()
			got := <-ended
			end = &got
		}
		return *end
	}
	defer stop()
	giveUp := func() { // after the coordinator stopped, so no standby overlaps it
		c.Close()
		if end := stop(); end.err == nil {
			_ = kv.Delete(context.Background(), leaderKey, jetstream.LastRevision(end.rev))
		}
	}
	if err := c.Start(ctx); err != nil {
		giveUp()
		return err
	}
	if e.onLead != nil {
		e.onLead(c)
	}
	select {
	case <-ctx.Done():
		giveUp()
		return nil
	case <-c.Fenced():
		// Holding the lease while serving nothing would stall every standby.
		giveUp()
		return errFenced
	case got := <-ended:
		end = &got
		c.Close()
		return got.err
	}
}

// leaseEnd is how keeping a lease ended: its last revision, or errLeaseLost.
type leaseEnd struct {
	rev uint64
	err error
}

// keepLease renews l every third of a lease until ctx ends or another coordinator
// holds the lease.
func (e *elector) keepLease(ctx context.Context, c *Coordinator, l lease) leaseEnd {
	cfg := e.cfg
	t := time.NewTicker(cfg.LeaderLease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return leaseEnd{rev: l.rev}
		case <-t.C:
		}
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, cfg.LeaderLease/3)
		next, err := e.renew(rctx, l.rev)
		cancel()
		switch {
		case err == nil:
			l = lease{next, sent}
			c.RenewedLease(sent, cfg.LeaderLease)
		case ctx.Err() != nil:
			return leaseEnd{rev: l.rev}
		case errors.Is(err, errLeaseLost):
			return leaseEnd{err: err}
		default:
			cfg.Logger.Warn("lease renewal failed; retrying", "coordinator", cfg.ID, "err", err)
			c.store.health().leaseWriteFailed(ctx, err) // storage.go
		}
	}
}

// takeBack renews a lease that names id, at the revision read: the CAS keeps it from
// taking a lease that changed hands meanwhile.
func (e *elector) takeBack(ctx context.Context) (lease, bool) {
	kv, id := e.kv, e.cfg.ID
	sent := time.Now()
	got, err := kv.Get(ctx, leaderKey)
	if err != nil || string(got.Value()) != id {
		return lease{}, false
	}
	rev, err := kv.Update(ctx, leaderKey, []byte(id), got.Revision())
	return lease{rev, sent}, err == nil
}

// errFenced is how a term ends when the coordinator found its memory was not the truth.
var errFenced = errors.New("fenced: stepping down, to lead again from the stored state")

// errLeaseLost means the lease is gone or names another coordinator.
var errLeaseLost = errors.New("lease lost to another coordinator")

// renew extends the lease written at rev. An entry moved past rev that still names id
// is a renewal whose acknowledgement was lost: it is renewed at its own revision.
func (e *elector) renew(ctx context.Context, rev uint64) (uint64, error) {
	kv, id := e.kv, e.cfg.ID
	next, err := kv.Update(ctx, leaderKey, []byte(id), rev)
	if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return next, err
	}
	got, gerr := kv.Get(ctx, leaderKey)
	switch {
	case errors.Is(gerr, jetstream.ErrKeyNotFound):
		// It expired (an outage longer than the lease) and nobody took it: whoever
		// takes it now leads, and if another did meanwhile, its term fences this one.
		if rev, err := kv.Create(ctx, leaderKey, []byte(id)); err == nil {
			return rev, nil
		}
		return 0, fmt.Errorf("%w: %w", errLeaseLost, err)
	case gerr == nil && string(got.Value()) != id:
		return 0, fmt.Errorf("%w: %w", errLeaseLost, err)
	case gerr != nil:
		return 0, gerr
	}
	return kv.Update(ctx, leaderKey, []byte(id), got.Revision())
}
