package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/system"
)

// TestFilledRecordsAreTheCoordinators: the records fillstore writes carry the headers
// the coordinator's own writes give them. A SCHEDULED record says it holds no unique
// key (Jobbus-Unique-Until 0), as the coordinator's do, so that recovery keeps a far
// one out of memory; without it recovery takes the record for one of a release before
// the header and reads it whole, and a measurement of far-future jobs on a filled
// store measured the wrong path. A finished record says when its retention ends.
func TestFilledRecordsAreTheCoordinators(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	cases := []struct {
		name        string
		scheduledIn time.Duration
		want        map[string]bool // header: present
	}{
		{"scheduled", time.Hour, map[string]bool{protocol.HeaderUniqueUntil: true, protocol.HeaderRunAt: true, protocol.HeaderQueue: true, protocol.HeaderExpires: false}},
		{"finished", 0, map[string]bool{protocol.HeaderExpires: true, jetstream.MsgTTLHeader: true, protocol.HeaderRunAt: false}},
	}
	for _, c := range cases {
		store := dir + "/" + c.name
		if err := fill(store, 3, time.Hour, c.scheduledIn); err != nil {
			t.Fatal(err)
		}
		sys, err := system.Start(ctx, system.Config{NATS: system.NATS{Server: []embeddednats.Option{embeddednats.WithListen("127.0.0.1:-1")}, StoreDir: store}})
		if err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.New(sys.Conn())
		if err != nil {
			t.Fatal(err)
		}
		stream, err := js.Stream(ctx, "KV_"+protocol.JobsBucket)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			msg, err := stream.GetLastMsgForSubject(ctx, "$KV."+protocol.JobsBucket+"."+fmt.Sprintf("filled-%08d", i))
			if err != nil {
				t.Fatal(err)
			}
			for h, present := range c.want {
				if got := msg.Header.Get(h) != ""; got != present {
					t.Errorf("%s record %d: header %s present %v, want %v (headers %v)", c.name, i, h, got, present, msg.Header)
				}
			}
			if c.scheduledIn > 0 && msg.Header.Get(protocol.HeaderUniqueUntil) != "0" {
				t.Errorf("%s record %d: %s %q, want 0 (holds no unique key)", c.name, i, protocol.HeaderUniqueUntil, msg.Header.Get(protocol.HeaderUniqueUntil))
			}
		}
		if err := sys.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
