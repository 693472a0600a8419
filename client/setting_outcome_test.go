package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// settingWrite is an admin write (a schedule's, a queue's or a limit's) sent by c.
type settingWrite struct {
	t    protocol.Type
	send func(ctx context.Context, c *client.Client) error
	// safe: sending it again does nothing twice (a trigger's makes a second job).
	safe bool
}

func settingWrites(schedule, queue string) []settingWrite {
	sched := client.Schedule{Name: schedule, Every: time.Hour, TaskType: "SHA256", Payload: map[string]string{"text": "tick"}}
	return []settingWrite{
		{protocol.TypeAddSchedule, func(ctx context.Context, c *client.Client) error {
			_, err := c.AddSchedule(ctx, sched)
			return err
		}, true},
		{protocol.TypeTriggerSchedule, func(ctx context.Context, c *client.Client) error {
			_, err := c.TriggerSchedule(ctx, schedule)
			return err
		}, false},
		{protocol.TypePauseSchedule, func(ctx context.Context, c *client.Client) error {
			_, err := c.PauseSchedule(ctx, schedule)
			return err
		}, true},
		{protocol.TypeResumeSchedule, func(ctx context.Context, c *client.Client) error {
			_, err := c.ResumeSchedule(ctx, schedule)
			return err
		}, true},
		{protocol.TypeRemoveSchedule, func(ctx context.Context, c *client.Client) error {
			_, err := c.RemoveSchedule(ctx, schedule)
			return err
		}, true},
		{protocol.TypeSetQueue, func(ctx context.Context, c *client.Client) error {
			_, err := c.SetQueue(ctx, queue, client.MaxRunning(3))
			return err
		}, true},
		{protocol.TypePauseQueue, func(ctx context.Context, c *client.Client) error {
			_, err := c.PauseQueue(ctx, queue)
			return err
		}, true},
		{protocol.TypeResumeQueue, func(ctx context.Context, c *client.Client) error {
			_, err := c.ResumeQueue(ctx, queue)
			return err
		}, true},
		{protocol.TypeSetLimit, func(ctx context.Context, c *client.Client) error {
			_, err := c.SetLimit(ctx, client.ForQueue(queue), "10/s", 2)
			return err
		}, true},
		{protocol.TypeRemoveLimit, func(ctx context.Context, c *client.Client) error {
			_, err := c.RemoveLimit(ctx, client.ForQueue(queue))
			return err
		}, true},
	}
}

// unknownSetting fails t unless err says the outcome of w is unknown, naming no job or
// workflow, and says whether sending it again is safe as it is.
func unknownSetting(t *testing.T, w settingWrite, err error) {
	t.Helper()
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("%s = %v; want an error matching ErrOutcomeUnknown", w.t, err)
	}
	if id, ok := client.OutcomeJob(err); ok {
		t.Errorf("%s = %v; names job %q", w.t, err, id)
	}
	if id, ok := client.OutcomeWorkflow(err); ok {
		t.Errorf("%s = %v; names workflow %q", w.t, err, id)
	}
	if safe := strings.Contains(err.Error(), "again is safe"); safe != w.safe {
		t.Errorf("%s = %v; says sending it again is safe: %v, want %v", w.t, err, safe, w.safe)
	}
}

// TestSettingWritesCutOffByTheConnectionAreOutcomeUnknown: a schedule's add, trigger,
// pause, resume or removal, a queue's pause, resume or settings, a limit's setting or
// removal, whose NATS connection closes after the coordinator took it, before its
// answer came, may have been applied (here each was): its error says the outcome is
// unknown, and whether sending it again is safe (not for a trigger, whose job sent
// again is a second one). Each was the connection's, "nats: connection closed", which
// reads as nothing done.
func TestSettingWritesCutOffByTheConnectionAreOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s := jobbustest.Start(t)
	native := client.New(s.NC)
	ctx := context.Background()
	schedule := func(t *testing.T) protocol.Schedule {
		t.Helper()
		list, err := native.Schedules(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, sc := range list {
			if sc.Name == "cut" {
				return sc
			}
		}
		return protocol.Schedule{}
	}
	queue := func(t *testing.T) protocol.QueueInfo {
		t.Helper()
		qs, err := native.Queues(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Name == "cutq" {
				return q
			}
		}
		return protocol.QueueInfo{}
	}
	limited := func(t *testing.T) bool {
		t.Helper()
		ls, err := native.Limits(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			if l.Name == "cutq" {
				return true
			}
		}
		return false
	}
	// What each write did, as a native client reads it back; they run in order.
	var lastJob string
	applied := map[protocol.Type]func(t *testing.T) bool{
		protocol.TypeAddSchedule: func(t *testing.T) bool { return schedule(t).Name == "cut" },
		protocol.TypeTriggerSchedule: func(t *testing.T) bool {
			id := schedule(t).LastJobID
			_, err := native.Status(ctx, id)
			return id != "" && id != lastJob && err == nil
		},
		protocol.TypePauseSchedule:  func(t *testing.T) bool { return schedule(t).Paused },
		protocol.TypeResumeSchedule: func(t *testing.T) bool { sc := schedule(t); return sc.Name != "" && !sc.Paused },
		protocol.TypeRemoveSchedule: func(t *testing.T) bool { return schedule(t).Name == "" },
		protocol.TypeSetQueue:       func(t *testing.T) bool { return queue(t).MaxRunning == 3 },
		protocol.TypePauseQueue:     func(t *testing.T) bool { return queue(t).Paused },
		protocol.TypeResumeQueue:    func(t *testing.T) bool { q := queue(t); return q.Name != "" && !q.Paused },
		protocol.TypeSetLimit:       limited,
		protocol.TypeRemoveLimit:    func(t *testing.T) bool { return !limited(t) },
	}
	for _, w := range settingWrites("cut", "cutq") {
		t.Run(string(w.t), func(t *testing.T) {
			lastJob = schedule(t).LastJobID
			err := w.send(ctx, cutOffClient(t, s))
			unknownSetting(t, w, err)
			if !applied[w.t](t) {
				t.Fatalf("%s cut off before its answer was not applied; want it applied (the test's premise)", w.t)
			}
		})
	}
}

// TestSettingWritesEndedByTheirContextAfterTheyWentAreOutcomeUnknown: the same writes,
// whose caller's context ends after the request reached a coordinator, before its
// answer, may have been applied: each error matches ErrOutcomeUnknown, and wraps
// context.Canceled when the caller cancelled. Each was the context's bare error.
func TestSettingWritesEndedByTheirContextAfterTheyWentAreOutcomeUnknown(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t, jobbustest.WithoutCoordinator())
	c := client.New(sys.NC, client.WithTimeout(time.Minute))
	for _, w := range settingWrites("s1", "q1") {
		e, _ := protocol.EndpointFor(w.t)
		t.Run(string(w.t)+"/cancelled", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// A coordinator that takes the request and has not answered when the
			// caller gives up.
			sub, err := sys.NC.Subscribe(e.Subject(), func(*nats.Msg) { cancel() })
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			err = w.send(ctx, c)
			unknownSetting(t, w, err)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("%s cancelled after it went = %v; want it to match context.Canceled", w.t, err)
			}
		})
		t.Run(string(w.t)+"/deadline", func(t *testing.T) {
			sub, err := sys.NC.Subscribe(e.Subject(), func(*nats.Msg) {}) // takes it, never answers
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			unknownSetting(t, w, w.send(ctx, c))
		})
	}
}
