package bus_test

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestWorkerIDsFitAnAddress: every worker id a registration may carry makes a valid
// worker address, so the protocol's bound and the bus's agree.
func TestWorkerIDsFitAnAddress(t *testing.T) {
	t.Parallel()
	a := bus.Address{Role: bus.RoleWorker, ID: strings.Repeat("é", protocol.MaxWorkerID/2)}
	if err := a.Validate(); err != nil {
		t.Fatalf("a worker id of %d bytes: %v", protocol.MaxWorkerID, err)
	}
}

func TestAddressString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		addr bus.Address
		want string
	}{
		{"PlainID", worker("worker-1a2b3c4d"), "worker/worker-1a2b3c4d"},
		{"AnyNode", anyOf(bus.RoleCoordinator), "coordinator/*"},
		{"UnderscoreDash", worker("a_b-C9"), "worker/a_b-C9"},
		{"Dot", worker("a.b"), "worker/~YS5i"},
		{"Star", worker("*"), "worker/~Kg"},
		{"Greater", worker(">"), "worker/~Pg"},
		{"Tilde", worker("~x"), "worker/~fng"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.addr.String(); got != tt.want {
				t.Fatalf("String() = %q, want %q", got, tt.want)
			}
			back, err := bus.ParseAddress(tt.want)
			if err != nil || back != tt.addr {
				t.Fatalf("ParseAddress(%q) = %+v, %v; want %+v", tt.want, back, err, tt.addr)
			}
		})
	}
}

func TestAddressRoundTripsUnsafeIDs(t *testing.T) {
	t.Parallel()
	ids := []string{"a.b", "*", ">", "a b", "tab\there", "ünïcødé", "日本", "x/y", "~", "~abc",
		"line\nbreak", "\x00nul", "\xff\xfe not utf8", "..", "a.*.>", strings.Repeat("é", bus.MaxIDLen/2)}
	for _, id := range ids {
		a := worker(id)
		s := a.String()
		if strings.ContainsAny(s, ". *>\t\r\n") {
			t.Errorf("String() of %q = %q contains a subject-unsafe character", id, s)
		}
		back, err := bus.ParseAddress(s)
		if err != nil || back != a {
			t.Errorf("ParseAddress(%q) = %+v, %v; want %+v", s, back, err, a)
		}
	}
}

func TestParseAddressRejects(t *testing.T) {
	t.Parallel()
	bad := []string{
		"", "worker", "worker/", "/x", "work er/x", "worker/a.b", "worker/a b", "worker/~",
		"worker/~YWJj", // "abc" is plain, so this token is not canonical
		"worker/~Kg==", // padding is not canonical
		"worker/~Kh",   // non-zero padding bits
		"worker/~K*",   // not base64url
		"worker/~~Kg",  // double prefix
		"worker/" + "~" + strings.Repeat("QUJD", bus.MaxIDLen), // too long
		"worker/" + strings.Repeat("a", bus.MaxIDLen+1),
	}
	for _, s := range bad {
		if a, err := bus.ParseAddress(s); !errors.Is(err, bus.ErrInvalidAddress) {
			t.Errorf("ParseAddress(%q) = %+v, %v; want ErrInvalidAddress", s, a, err)
		}
	}
}

// TestSubjects pins the subjects on the wire, seen by plain NATS subscribers: the
// addressee, then the sender, then the path.
func TestSubjects(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	raw := dial(t, s.url)
	c := connect(t, s.url, coordinator("c1"))
	odd := connect(t, s.url, worker("a.b"))
	longID := strings.Repeat("ü", bus.MaxIDLen/2) // MaxIDLen bytes, none plain
	long := connect(t, s.url, worker(longID))
	longToken := "~" + base64.RawURLEncoding.EncodeToString([]byte(longID))
	tests := []struct {
		name    string
		from    *bus.Node
		to      bus.Address
		subject string
	}{
		{"Direct", c, worker("w1"), "jobbus.node.worker.w1.coordinator.c1.task.assign"},
		{"DirectUnsafeID", c, worker("w.1 ü"), "jobbus.node.worker.~dy4xIMO8.coordinator.c1.task.assign"},
		{"RoleWide", c, anyOf(bus.RoleCoordinator), "jobbus.role.coordinator.coordinator.c1.task.assign"},
		{"FromUnsafeID", odd, anyOf(bus.RoleCoordinator), "jobbus.role.coordinator.worker.~YS5i.task.assign"},
		{"LongestIDs", long, worker(longID),
			"jobbus.node.worker." + longToken + ".worker." + longToken + ".task.assign"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sub, err := raw.SubscribeSync(tt.subject)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			if err := raw.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := tt.from.Tell(context.Background(), tt.to, "task.assign", map[string]int{"n": 1}); err != nil {
				t.Fatal(err)
			}
			m, err := sub.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("nothing on %s: %v", tt.subject, err)
			}
			// The subject names the sender; a header would only be one more claim.
			checkHeaders(t, m, map[string]string{bus.HeaderKind: "TELL", bus.HeaderPath: "task.assign", bus.HeaderFrom: ""})
			if string(m.Data) != `{"n":1}` {
				t.Fatalf("payload %q", m.Data)
			}
		})
	}
	t.Run("Presence", func(t *testing.T) {
		sub, err := raw.SubscribeSync("jobbus.presence.worker.~YS5i")
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		if err := raw.Flush(); err != nil {
			t.Fatal(err)
		}
		w := connect(t, s.url, worker("a.b"), bus.WithHeartbeat(10*time.Millisecond))
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		checkHeaders(t, m, map[string]string{bus.HeaderKind: "HEARTBEAT", bus.HeaderFrom: "worker/~YS5i"})
		_ = w.Close()
		testkit.Eventually(t, 10*time.Second, "goodbye", func() bool {
			m, err := sub.NextMsg(10 * time.Second)
			return err == nil && m.Header.Get(bus.HeaderPresence) == "leave"
		})
	})
}

func checkHeaders(t *testing.T, m *nats.Msg, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := m.Header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
}

func FuzzParseAddress(f *testing.F) {
	for _, s := range []string{"worker/worker-1a2b3c4d", "coordinator/*", "worker/~YS5i", "worker/~", "a/~Kg=="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := bus.ParseAddress(s)
		if err != nil {
			if !errors.Is(err, bus.ErrInvalidAddress) {
				t.Fatalf("error %v is not ErrInvalidAddress", err)
			}
			return
		}
		// Canonical: an accepted address prints as the input it came from.
		if got := a.String(); got != s {
			t.Fatalf("ParseAddress(%q).String() = %q", s, got)
		}
	})
}

func FuzzAddressID(f *testing.F) {
	for _, s := range []string{"w1", "a.b", "*", "ü", "~Kg", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		a := worker(id)
		if a.Validate() != nil {
			return
		}
		back, err := bus.ParseAddress(a.String())
		if err != nil || back != a {
			t.Fatalf("%q: ParseAddress(String()) = %+v, %v", id, back, err)
		}
	})
}
