package bridge_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus"
)

// BenchmarkMuAsk is one ask round trip, one at a time, to a native bus node's echo
// handler on a NATS connection of its own: from a Mu node over TCP through the bridge
// (MuToNative), from a native node on another NATS connection (NativeToNative, the
// baseline), and the other way, from that native node to the Mu node (NativeToMu). It
// reports the median and 99th percentile besides the mean:
//
//	go test -run '^$' -bench BenchmarkMuAsk -benchtime 20000x -count 5 ./bridge/
func BenchmarkMuAsk(b *testing.B) {
	s := setup(b, noCoordinator(), withMu(nil))
	url := s.Server.ClientURL()
	connect := func(id string) *bus.Node {
		n, err := bus.Connect(context.Background(), url, bus.Address{Role: "native", ID: id}, bus.WithAskTimeout(waitFor))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = n.Close() })
		return n
	}
	responder, asker := connect("responder"), connect("asker")
	if err := responder.Handle("echo", func(_ context.Context, r *bus.Request) (any, error) { return json.RawMessage(r.Data), nil }); err != nil {
		b.Fatal(err)
	}
	m := s.muNode("127.0.0.1:27100")
	payload := json.RawMessage(`{"n":1}`)
	ctx := context.Background()
	to := bus.Address{Role: "native", ID: "responder"}
	for _, bc := range []struct {
		name string
		ask  func() error
	}{
		{"MuToNative", func() error { _, err := m.Ask(ctx, "echo@native/responder", payload); return err }},
		{"NativeToNative", func() error { _, err := bus.Ask[json.RawMessage](ctx, asker, to, "echo", payload); return err }},
		{"NativeToMu", func() error {
			_, err := bus.Ask[json.RawMessage](ctx, asker, muAddr("127.0.0.1:27100"), "echo", payload)
			return err
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for range 100 { // warm up connections and pools
				if err := bc.ask(); err != nil {
					b.Fatal(err)
				}
			}
			lat := make([]time.Duration, 0, 1<<14)
			for b.Loop() {
				start := time.Now()
				if err := bc.ask(); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
		})
	}
}
