package embeddednats_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/embeddednats"
)

// TestSystemUserAndMonitoring: with a system user and a monitoring port, the NATS
// CLI's server commands have what they need (the system account answers the JetStream
// report's ping, /jsz serves), and an unauthenticated client still uses JetStream.
func TestSystemUserAndMonitoring(t *testing.T) {
	t.Parallel()
	srv := start(t, "", embeddednats.WithHTTPListen("127.0.0.1:-1"), embeddednats.WithSystemUser("sys", "s3cret"))

	// A client without credentials lands in the jobbus account, with JetStream.
	anon := connect(t, func() (*nats.Conn, error) { return nats.Connect(srv.ClientURL()) })
	js, err := jetstream.New(anon)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "ANON"}); err != nil {
		t.Fatalf("JetStream for an unauthenticated client: %v", err)
	}
	inproc := connect(t, func() (*nats.Conn, error) { return srv.Connect() })
	if _, err := jetstream.New(inproc); err != nil {
		t.Fatal(err)
	}

	// The system user gets the servers' JetStream reports (`nats server report jetstream`).
	sys := connect(t, func() (*nats.Conn, error) { return nats.Connect(srv.ClientURL(), nats.UserInfo("sys", "s3cret")) })
	msg, err := sys.Request("$SYS.REQ.SERVER.PING.JSZ", []byte(`{}`), 10*time.Second)
	if err != nil {
		t.Fatalf("JSZ ping as the system user: %v", err)
	}
	var jsz struct {
		Data struct {
			Streams int `json:"streams"`
		} `json:"data"`
	}
	if err := json.Unmarshal(msg.Data, &jsz); err != nil || jsz.Data.Streams != 1 {
		t.Errorf("JSZ reply %s (err %v), want the one KV stream", msg.Data, err)
	}

	// A wrong password is refused, not let in as the unauthenticated user.
	if nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("sys", "wrong")); err == nil {
		nc.Close()
		t.Error("wrong system password accepted")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("wrong password: %v, want an authorization error", err)
	}

	// The monitoring port serves /jsz.
	if srv.MonitorURL() == "" {
		t.Fatal("no monitoring URL")
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := hc.Get(srv.MonitorURL() + "/jsz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !json.Valid(body) {
		t.Errorf("/jsz: %s %s", resp.Status, body)
	}
}

func TestMonitoringOffByDefault(t *testing.T) {
	t.Parallel()
	if u := start(t, "").MonitorURL(); u != "" {
		t.Errorf("MonitorURL %q without WithHTTPListen", u)
	}
}

func TestSystemUserNeedsPassword(t *testing.T) {
	t.Parallel()
	_, err := embeddednats.Start(context.Background(), embeddednats.WithListen("127.0.0.1:-1"),
		embeddednats.WithStoreDir(t.TempDir()), embeddednats.WithSystemUser("sys", ""))
	if err == nil {
		t.Fatal("a system user without a password started")
	}
}
