package coordinator

// TEMP stub of the foundation's controls (contract section 4), replaced at merge.

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

type control struct {
	key   string
	value []byte
	rev   uint64
}

type controlStore interface {
	put(ctx context.Context, key string, value []byte, rev uint64) (uint64, error)
	remove(ctx context.Context, key string, rev uint64) error
	list(ctx context.Context, prefix string) ([]control, error)
}

var errControlChanged = errors.New("control changed meanwhile")

type memControls struct {
	mu  sync.Mutex
	seq uint64
	m   map[string]control
}

func (c *memControls) put(_ context.Context, key string, value []byte, rev uint64) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]control{}
	}
	if old, ok := c.m[key]; (ok && old.rev != rev) || (!ok && rev != 0) {
		return 0, errControlChanged
	}
	c.seq++
	c.m[key] = control{key, value, c.seq}
	return c.seq, nil
}

func (c *memControls) remove(_ context.Context, key string, rev uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[key]; ok && rev != 0 && old.rev != rev {
		return errControlChanged
	}
	delete(c.m, key)
	return nil
}

func (c *memControls) list(_ context.Context, prefix string) ([]control, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []control
	for k, v := range c.m {
		if strings.HasPrefix(k, prefix) {
			out = append(out, v)
		}
	}
	return out, nil
}

func (s *memStore) controls() controlStore { return &s.b.ctl }

type jsControls struct{ s *jsStore }

func (s *jsStore) controls() controlStore { return jsControls{s} }

func (c jsControls) kv(ctx context.Context) (jetstream.KeyValue, error) {
	c.s.ctlOnce.Do(func() {
		c.s.ctlKV, c.s.ctlErr = OpenBucket(ctx, c.s.nc, c.s.js, *c.s.cfg, jetstream.KeyValueConfig{Bucket: protocol.ControlsBucket, History: 1, Storage: jetstream.FileStorage})
	})
	return c.s.ctlKV, c.s.ctlErr
}

func (c jsControls) put(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	kv, err := c.kv(ctx)
	if err != nil {
		return 0, err
	}
	var n uint64
	if rev == 0 {
		n, err = kv.Create(ctx, key, value)
	} else {
		n, err = kv.Update(ctx, key, value, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, errControlChanged
	}
	return n, err
}

func (c jsControls) remove(ctx context.Context, key string, rev uint64) error {
	kv, err := c.kv(ctx)
	if err != nil {
		return err
	}
	var opts []jetstream.KVDeleteOpt
	if rev != 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	return kv.Purge(ctx, key, opts...)
}

func (c jsControls) list(ctx context.Context, prefix string) ([]control, error) {
	kv, err := c.kv(ctx)
	if err != nil {
		return nil, err
	}
	lister, err := kv.ListKeysFiltered(ctx, prefix+">")
	if err != nil {
		return nil, err
	}
	var out []control
	for k := range lister.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue
		}
		out = append(out, control{k, e.Value(), e.Revision()})
	}
	return out, nil
}

// becomeQueued: TEMP stub of the foundation's.
func (s *scheduler) becomeQueued(j *job) {
	j.rec.State = protocol.StateQueued
	j.rec.RetryAt = 0
	s.markDirty(j, nil)
	s.ready.push(j)
}
