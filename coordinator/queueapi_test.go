package coordinator_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// TestQueueSettingsChangedMeanwhile: a queue's settings that another stored since the
// coordinator read them are not written over. The change is refused as changed
// meanwhile, the coordinator takes on what is stored, and the change sent again is
// made to that.
func TestQueueSettingsChangedMeanwhile(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := t.Context()
	if _, err := s.Client.SetQueue(ctx, "low", client.MaxRunning(2)); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(s.NC)
	must(t, err)
	kv, err := js.KeyValue(ctx, protocol.JobsBucket)
	must(t, err)
	key := protocol.ControlPrefix + protocol.QueueControlPrefix + "low"
	e, err := kv.Get(ctx, key)
	must(t, err)
	theirs := protocol.QueueSettings{Paused: true, MaxRunning: 5}
	value, err := json.Marshal(theirs)
	must(t, err)
	_, err = kv.Update(ctx, key, value, e.Revision()) // as a coordinator that led meanwhile
	must(t, err)

	if _, err := s.Client.SetQueue(ctx, "low", client.KeyConcurrency(1)); err == nil || !strings.Contains(err.Error(), "changed meanwhile") {
		t.Fatalf("a change over settings changed meanwhile: %v, want them refused as changed meanwhile", err)
	}
	qs, err := s.Client.Queues(ctx)
	must(t, err)
	if len(qs) != 1 || qs[0].Name != "low" || qs[0].QueueSettings != theirs {
		t.Fatalf("queues after the refusal: %+v, want low with the settings stored, %+v", qs, theirs)
	}
	q, err := s.Client.SetQueue(ctx, "low", client.KeyConcurrency(1))
	must(t, err)
	want := protocol.QueueSettings{Paused: true, MaxRunning: 5, KeyConcurrency: 1}
	if q.QueueSettings != want {
		t.Fatalf("sent again: %+v, want %+v", q.QueueSettings, want)
	}
	e, err = kv.Get(ctx, key)
	must(t, err)
	var stored protocol.QueueSettings
	must(t, json.Unmarshal(e.Value(), &stored))
	if stored != want {
		t.Fatalf("stored %+v, want %+v", stored, want)
	}
}
