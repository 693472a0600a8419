package bus

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
)

// anyPath is the handlers-map key of HandleAny's subscription: no path contains '>'.
const anyPath = ">"

// HandleAny serves every path sent to the node's own address that no Handle of the
// node serves: fn receives the path in Request.Path. A gateway uses it to pass a
// node's messages on to wherever the node really is (the bridge does, for the nodes on
// its Mu port). A node has at most one; it does not serve its role's subjects.
func (n *Node) HandleAny(fn HandlerFunc) error {
	n.mu.Lock()
	switch {
	case n.handlers == nil:
		n.mu.Unlock()
		return fmt.Errorf("handle any: %w", ErrClosed)
	case n.handlers[anyPath] != nil:
		n.mu.Unlock()
		return fmt.Errorf("handle any: %w", ErrHandled)
	}
	// "jobbus.node.<role>.<idtoken>." then the sender's two tokens, then the path.
	prefix := subject(n.self, "", "")
	prefix = prefix[:len(prefix)-1]
	h := &handling{stop: make(chan struct{}), slots: n.slots}
	s, err := n.nc.Subscribe(prefix+anySender+".>", func(m *nats.Msg) {
		path, ok := pathAfterSender(m.Subject, prefix)
		if !ok {
			n.stats.dropped.Add(1)
			return
		}
		if n.handles(path) {
			return // its own handler's subscription has it too
		}
		n.dispatch(path, fn, m, h)
	})
	if err != nil {
		n.mu.Unlock()
		return fmt.Errorf("handle any: %w", err)
	}
	h.subs = []*nats.Subscription{s}
	n.handlers[anyPath] = h
	n.mu.Unlock()
	n.sync()
	return nil
}

// UnhandleAny stops serving HandleAny's paths as Unhandle stops serving a path.
func (n *Node) UnhandleAny() error { return n.Unhandle(anyPath) }

// handles reports whether path has a handler of its own on the node's own subject: a
// handler with OnlyRole has just the role's queue subscription, and the catch-all
// serves its path on the node's address.
func (n *Node) handles(path string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := n.handlers[path]
	return h != nil && len(h.subs) > 0 && h.subs[0].Queue == "" // the direct subscription comes first
}

// pathAfterSender reads the path of a subject that starts with prefix and then names
// its sender in two tokens.
func pathAfterSender(subj, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(subj, prefix)
	if !ok {
		return "", false
	}
	for range 2 {
		i := strings.IndexByte(rest, '.')
		if i <= 0 {
			return "", false
		}
		rest = rest[i+1:]
	}
	return rest, validPath(rest) == nil
}
