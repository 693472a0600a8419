package coordinator

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TEMPORARY until the foundation lands: the record's queue and key, its aging start,
// flow control and timers.

func queueOf(j *job) string  { return protocol.DefaultQueue }
func keyOf(j *job) string    { return "" }
func agingFrom(j *job) int64 { return j.rec.CreatedAt }

func (s *scheduler) admits(queue, taskType string, now time.Time) (bool, time.Time) {
	return true, time.Time{}
}

func (s *scheduler) callAt(at time.Time, fn func(time.Time)) {}

// started counts j's start against its queue's rate and flow control.
func (s *scheduler) started(j *job, now time.Time) {
	s.ready.queue(queueOf(j)).startedAt(now)
}

// TEMPORARY: the controls of the contract, in memory.
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

var errControlChanged = errors.New("control changed")

type memControls struct {
	mu   sync.Mutex
	m    map[string]control
	next uint64
}

func (m *memControls) put(_ context.Context, key string, value []byte, rev uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[string]control{}
	}
	if m.m[key].rev != rev {
		return 0, errControlChanged
	}
	m.next++
	m.m[key] = control{key, value, m.next}
	return m.next, nil
}

func (m *memControls) remove(_ context.Context, key string, rev uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rev != 0 && m.m[key].rev != rev {
		return errControlChanged
	}
	delete(m.m, key)
	return nil
}

func (m *memControls) list(_ context.Context, prefix string) ([]control, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []control
	for k, c := range m.m {
		if strings.HasPrefix(k, prefix) {
			out = append(out, c)
		}
	}
	return out, nil
}

func (s *scheduler) controls() controlStore { return &s.tmpControls }
