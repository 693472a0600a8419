package bridge_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := bridge.DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	d := bridge.DefaultConfig()
	if d.WorkerListen != "127.0.0.1:7070" || d.ClientListen != "127.0.0.1:7071" || d.MaxConns != 1024 {
		t.Fatalf("defaults %+v", d)
	}
	bad := bridge.Config{WorkerListen: "nonsense", MaxConns: 0, WriteQueue: -1}
	err := bad.Validate()
	if err == nil {
		t.Fatal("a zero config validated")
	}
	// Every problem at once.
	for _, want := range []string{"WorkerListen", "MaxConns", "MaxInFlight", "WriteQueue", "FrameStallTimeout", "WriteTimeout", "RequestTimeout", "ResultRetryFor"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %q, missing %s", err, want)
		}
	}
	if err := (bridge.Config{}).Validate(); err == nil || !strings.Contains(err.Error(), "no port to serve") {
		t.Errorf("no ports: %v", err)
	}
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	s := setup(t)
	if err := s.br.Start(context.Background()); !errors.Is(err, bridge.ErrStarted) {
		t.Fatalf("second Start: %v", err)
	}
	cfg := fastBridge()
	cfg.WorkerListen = "" // client port only
	br, err := bridge.New(s.NC, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := br.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if br.WorkerAddr() != nil || br.ClientAddr() == nil {
		t.Fatalf("addresses %v %v", br.WorkerAddr(), br.ClientAddr())
	}
	c := dial(t, br.ClientAddr())
	if _, ok := c.Request(&protocol.ListWorkers{}).(*protocol.WorkerList); !ok {
		t.Fatal("client port not serving")
	}
	for range 2 { // idempotent
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
	}
	c.ExpectClosed()
	if err := br.Start(context.Background()); !errors.Is(err, bridge.ErrClosed) {
		t.Fatalf("Start after Close: %v", err)
	}
	if _, err := bridge.New(nil, cfg); err == nil {
		t.Fatal("New accepted a nil connection")
	}
}
