package natsurl_test

import (
	"testing"

	"github.com/jobbus/jobbus/internal/natsurl"
)

// TestRedactHidesSecrets: a password or token never survives Redact, whatever form of
// URL nats.go accepts carries it: with or without a scheme, in a list, or one that
// does not parse as a URL.
func TestRedactHidesSecrets(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"nats://bob:topsecret@h:4222":         "nats://bob:xxxxx@h:4222",
		"nats://topsecret@h:4222":             "nats://xxxxx@h:4222",
		"bob:topsecret@h:4222":                "bob:xxxxx@h:4222",
		"topsecret@h:4222":                    "xxxxx@h:4222",
		"nats://a:4222, bob:topsecret@h:4222": "nats://a:4222,bob:xxxxx@h:4222",
		"nats://bob:top/secret@h:4222":        "nats://xxxxx@h:4222",
		"tls://bob:topsecret%zz@h:4222":       "tls://xxxxx@h:4222",
		"nats://h:4222":                       "nats://h:4222",
		"h:4222":                              "h:4222",
	} {
		if got := natsurl.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
