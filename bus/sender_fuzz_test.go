package bus

import (
	"errors"
	"strings"
	"testing"
)

// FuzzSender: the sender a handler reads from a subject, which any publisher allowed
// to publish there writes. A node's own address always reads back as itself; anything
// else is either refused with ErrInvalidAddress or read as a valid node address whose
// spelling is exactly the subject's tokens, so that one sender has one spelling and a
// permission on that spelling is a permission on the sender.
func FuzzSender(f *testing.F) {
	for _, s := range [][3]string{
		{"worker", "edge-1", "task.result"},
		{"worker", "a.b", "worker.register"},
		{"worker", "*", "p"},
		{"worker", ">", "p"},
		{"worker", "~", "p"},
		{"worker", "~YQ", "p"},
		{"coordinator", "~YS5i", "x.y"},
		{"", "w1", "p"},
		{"wor.ker", "w1", "p"},
		{"worker", "w1", ""},
		{"worker", "w1", "a..b"},
		{"worker", "w1", "a.*"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	to := Address{Role: RoleCoordinator}
	f.Fuzz(func(t *testing.T, role, id, path string) {
		from := Address{Role: Role(role), ID: id}
		if validSelf(from) == nil && validPath(path) == nil {
			subj := subject(to, senderTokens(from), path)
			if got, err := sender(subj, path); err != nil || got != from {
				t.Fatalf("%+v on %q read back as %+v, %v", from, subj, got, err)
			}
		}
		subj := subjectRole + string(to.Role) + "." + role + "." + id + "." + path
		got, err := sender(subj, path)
		if err != nil {
			if !errors.Is(err, ErrInvalidAddress) {
				t.Fatalf("sender(%q, %q): %v is not ErrInvalidAddress", subj, path, err)
			}
			return
		}
		if err := validSelf(got); err != nil {
			t.Fatalf("sender(%q, %q) = %+v, invalid: %v", subj, path, got, err)
		}
		if tail := "." + senderTokens(got) + "." + path; !strings.HasSuffix(subj, tail) {
			t.Fatalf("sender(%q, %q) = %+v, spelled %q: not the subject's", subj, path, got, tail)
		}
	})
}
