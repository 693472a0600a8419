package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/embeddednats"
)

// startedCoordinator is a coordinator started on a fresh embedded server, holding no
// lease (it answers everything).
func startedCoordinator(t *testing.T) *Coordinator {
	t.Helper()
	ctx := context.Background()
	srv, err := embeddednats.Start(ctx, embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := New(nc, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// jetStreamOf is c's store, the JetStream one (c has no SyncJobs).
func jetStreamOf(t *testing.T, c *Coordinator) *jsStore {
	t.Helper()
	s, ok := c.store.(*jsStore)
	if !ok {
		t.Fatalf("the coordinator's store is a %T, want *jsStore", c.store)
	}
	return s
}

// heldWrite takes job j's current version as a write a committer holds (as takeDirty
// does), whose waiter sends its outcome on the channel returned.
func heldWrite(t *testing.T, c *Coordinator, j *job) (pendingWrite, <-chan error) {
	t.Helper()
	done := make(chan error, 1)
	s := c.sched
	s.mu.Lock()
	defer s.mu.Unlock()
	j.version++
	j.waiters = append(j.waiters, waiter{version: j.version, fn: func(err error) { done <- err }})
	j.writing = true
	s.wq.writes++
	w, err := s.wq.pendingWrite(j)
	if err != nil {
		t.Fatal(err)
	}
	return w, done
}

// landCopy stores w as its earlier copy would have been, and returns its revision.
func landCopy(t *testing.T, c *Coordinator, w *pendingWrite) uint64 {
	t.Helper()
	js := jetStreamOf(t, c)
	ack, err := js.js.PublishMsg(context.Background(), js.messages(w)[0])
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// TestAbandonedCreateIsReadBack: a create whose earlier copy's outcome is unknown, and
// which the coordinator stops writing, is read back before its submitter hears anything:
// stored means stored; absent after a copy was refused outright (a newer term) means not
// stored, and the job is forgotten; absent with nothing refused may still land, so the
// outcome is unknown.
func TestAbandonedCreateIsReadBack(t *testing.T) {
	t.Parallel()
	fenced := fmt.Errorf("%w: term 1 ended", ErrFenced)
	for _, tc := range []struct {
		name  string
		land  bool
		err   error
		check func(err error) error
	}{
		{"LandedIsStored", true, context.Canceled, func(err error) error { return err }},
		{"AbsentAfterARefusalIsNotStored", false, fenced, func(err error) error {
			if err == nil || errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, ErrFenced) {
				return fmt.Errorf("outcome %v, want the refusal itself", err)
			}
			return nil
		}},
		{"AbsentWithoutARefusalIsUnknown", false, context.Canceled, func(err error) error {
			if !errors.Is(err, ErrOutcomeUnknown) {
				return fmt.Errorf("outcome %v, want ErrOutcomeUnknown", err)
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := startedCoordinator(t)
			s := c.sched
			s.mu.Lock()
			j := s.newJob(newID(), &protocol.SubmitJob{TaskType: "SHA256", Payload: json.RawMessage(`{"text":"x"}`)}, 3, protocol.PriorityNormal, "", "")
			j.version = 0
			s.mu.Unlock()
			w, done := heldWrite(t, c, j)
			s.mu.Lock()
			j.uncertain = true // its first copy went unanswered
			s.mu.Unlock()
			var rev uint64
			if tc.land {
				rev = landCopy(t, c, &w)
			}
			jetStreamOf(t, c).oc.abandon([]pendingWrite{w}, false, tc.err)
			if err := tc.check(<-done); err != nil {
				t.Fatal(err)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			_, kept := s.jobs[w.id]
			switch {
			case tc.land && (j.rev != rev || j.uncertain):
				t.Errorf("stored at %d: the job's revision is %d, uncertain %v", rev, j.rev, j.uncertain)
			case errors.Is(tc.err, ErrFenced) && kept:
				t.Error("a create certainly not stored is still kept")
			}
		})
	}
}

// TestUpdateThatLandedEarlierDoesNotFence: an update whose first copy was stored but
// not acknowledged is written again; the retry's revision check fails on that very
// copy. The store is read back, the copy is found to be the write's own, and the
// coordinator goes on from it instead of fencing itself. When what moved the record is
// not the write's own, it still fences.
func TestUpdateThatLandedEarlierDoesNotFence(t *testing.T) {
	t.Parallel()
	for _, own := range []bool{true, false} {
		t.Run(fmt.Sprintf("Own=%v", own), func(t *testing.T) {
			t.Parallel()
			c := startedCoordinator(t)
			s := c.sched
			ctx := context.Background()
			j, w, done, rev := inDoubtMovedUpdate(t, c, newID(), own)

			jetStreamOf(t, c).commit(ctx, []pendingWrite{w})
			err := <-done
			fence := s.fencedBy()
			switch {
			case own && (err != nil || fence != nil || j.rev != rev):
				t.Fatalf("own copy: outcome %v, fenced %v, revision %d (stored at %d)", err, fence, j.rev, rev)
			case !own && (err == nil || fence == nil):
				t.Fatalf("another's write: outcome %v, fenced %v; want fenced", err, fence)
			}
		})
	}
}

// waitIdle waits until no writer holds j.
func waitIdle(t *testing.T, c *Coordinator, j *job) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.sched.mu.Lock()
		busy := j.writing
		c.sched.mu.Unlock()
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the job's write never ended")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestUpdateInDoubtIsNotFencedUnread: an update whose first copy's answer was lost is
// written again, and the retry's revision check fails on what moved the record; but the
// store cannot be read back (in a cluster whose quorum just returned, a replica that
// still takes the stream for leaderless answers the read "temporarily unavailable"
// while its leader takes writes). Whose write moved the record is unknown, so the
// coordinator does not fence itself: it keeps writing, and once the store is readable
// it goes on from its own copy, or fences when the copy is another's.
func TestUpdateInDoubtIsNotFencedUnread(t *testing.T) {
	t.Parallel()
	for _, own := range []bool{true, false} {
		t.Run(fmt.Sprintf("Own=%v", own), func(t *testing.T) {
			t.Parallel()
			id := newID()
			srv, conf := unreadableServer(t, id)
			refused := make(chan error, 16)
			c := coordinatorOn(t, srv, storedFailures(refused))
			s := c.sched
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			j, w, done, rev := inDoubtMovedUpdate(t, c, id, own)

			committed := make(chan struct{})
			go func() {
				defer close(committed)
				jetStreamOf(t, c).commit(ctx, []pendingWrite{w})
			}()
			// Two copies refused while the record cannot be read: the write goes on.
			for range 2 {
				select {
				case <-refused:
				case <-committed:
				}
			}
			if fence := s.fencedBy(); fence != nil {
				t.Fatalf("fenced while the record could not be read back: %v", fence)
			}
			select {
			case err := <-done:
				t.Fatalf("the write ended while the record could not be read back: %v", err)
			default:
			}

			readable(t, srv, conf)
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the write never ended once the record could be read")
			}
			fence := s.fencedBy()
			s.mu.Lock()
			gotRev := j.rev
			s.mu.Unlock()
			switch {
			case own && (err != nil || fence != nil || gotRev != rev):
				t.Fatalf("own copy: outcome %v, fenced %v, revision %d (stored at %d)", err, fence, gotRev, rev)
			case !own && (err == nil || fence == nil):
				t.Fatalf("another's write: outcome %v, fenced %v; want fenced", err, fence)
			}
		})
	}
}

// unreadableServer starts a server whose user may not read job id's record (a direct
// get of it is refused), and returns it with its configuration file (readable).
func unreadableServer(t *testing.T, id string) (*embeddednats.Server, string) {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	deny := `"$JS.API.DIRECT.GET.` + jobsStream + `.` + jobsSubjects + id + `"`
	writeUsers(t, conf, `permissions: { publish: { allow: ">", deny: [`+deny+`] } }`)
	srv, err := embeddednats.Start(context.Background(), embeddednats.WithConfigFile(conf))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return srv, conf
}

// writeUsers writes conf: one account with JetStream, whose user c has perms.
func writeUsers(t *testing.T, conf, perms string) {
	t.Helper()
	text := `host: 127.0.0.1
port: -1
store_dir: "` + filepath.Join(filepath.Dir(conf), "store") + `"
accounts: { JOBBUS: { jetstream: enabled, users: [{user: c, password: pw, ` + perms + `}] } }`
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// readable lets srv's user read every record again (a configuration reload).
func readable(t *testing.T, srv *embeddednats.Server, conf string) {
	t.Helper()
	writeUsers(t, conf, "")
	o, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	// What embeddednats sets beside the file (serverOptions) stays as it was.
	o.JetStream, o.NoLog, o.NoSigs, o.DisableJetStreamBanner = true, true, true, true
	o.JetStreamLimits.MaxBatchSize = embeddednats.MaxAtomicBatch
	if err := srv.NATS().ReloadOptions(o); err != nil {
		t.Fatal(err)
	}
}

// coordinatorOn is a coordinator started on srv as its user c, holding no lease.
func coordinatorOn(t *testing.T, srv *embeddednats.Server, obs Observer) *Coordinator {
	t.Helper()
	// The refused reads are the test's doing: their reports are not printed.
	nc, err := srv.Connect(nats.UserInfo("c", "pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := DefaultConfig()
	cfg.Observer = obs
	c, err := New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// storedFailures is an Observer that sends every failed job write's error on ch,
// when ch has room.
type storedFailures chan<- error

func (storedFailures) Submitted(SubmitOutcome)          {}
func (storedFailures) JobChanged(JobChange)             {}
func (storedFailures) DeadlineExpired(string)           {}
func (storedFailures) Synced(time.Duration, int, error) {}
func (ch storedFailures) Stored(_ time.Duration, err error, _ bool, _ int) {
	if err != nil {
		select {
		case ch <- err:
		default:
		}
	}
}

// inDoubtMovedUpdate stores job id, then holds an update of it (w, answered on done)
// whose first copy landed at rev unacknowledged: the write's own copy when own, else
// another coordinator's of the same revision.
func inDoubtMovedUpdate(t *testing.T, c *Coordinator, id string, own bool) (*job, pendingWrite, <-chan error, uint64) {
	t.Helper()
	s := c.sched
	stored := make(chan error, 1)
	s.mu.Lock()
	j := s.newJob(id, &protocol.SubmitJob{TaskType: "SHA256", Payload: json.RawMessage(`{"text":"x"}`)}, 3, protocol.PriorityNormal, "", "")
	s.markDirty(j, func(err error) { stored <- err })
	s.unlock()
	if err := <-stored; err != nil {
		t.Fatal(err)
	}
	waitIdle(t, c, j)

	s.mu.Lock()
	j.rec.Error = ptr("changed")
	s.mu.Unlock()
	w, done := heldWrite(t, c, j)
	moved := w
	if !own { // another coordinator's write of the same revision
		other := j.rec
		other.Error = ptr("someone else's")
		moved.data, _ = json.Marshal(other)
	}
	rev := landCopy(t, c, &moved)
	s.mu.Lock()
	j.uncertain = true // the first copy's acknowledgement was lost
	s.mu.Unlock()
	return j, w, done, rev
}
