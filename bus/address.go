package bus

import (
	"encoding/base64"
	"fmt"
	"strings"
)

// Role names a kind of node. Every node of a role serves the role-wide subjects of the
// paths it handles with AsRole, in the NATS queue group named after the role.
type Role string

// The roles of jobbus.
const (
	RoleCoordinator Role = "coordinator"
	RoleWorker      Role = "worker"
	RoleBridge      Role = "bridge"
	RoleClient      Role = "client"
	// RoleMu is the role of the nodes that speak PowerJob's Mu frames on the bridge's
	// Mu port; such a node's id is its address, "host:port".
	RoleMu Role = "mu"
)

// MaxIDLen bounds a node id in bytes. Ids come from the network (TCP workers choose their
// own), and an id ends up in subjects, whose length NATS limits.
const MaxIDLen = 512

// anyID is how String and ParseAddress write the empty id, "any node of the role".
const anyID = "*"

// encodedPrefix starts an id token that carries an encoded id. A plain id never contains
// it, so the two forms cannot collide.
const encodedPrefix = "~"

// Address names a node (Role and ID) or, with an empty ID, any node of a role: messages to
// such an address go to the role-wide subject and one node of the role's queue group
// receives each.
type Address struct {
	Role Role
	ID   string
}

// String gives "role/idtoken", or "role/*" for any node of the role. Plain ids
// ([A-Za-z0-9_-]) appear as they are, others encoded (see ParseAddress).
func (a Address) String() string {
	if a.ID == "" {
		return string(a.Role) + "/" + anyID
	}
	return string(a.Role) + "/" + idToken(a.ID)
}

// IsAny reports whether a addresses any node of its role rather than one node.
func (a Address) IsAny() bool { return a.ID == "" }

// Validate reports whether a can be used on the bus: a plain, non-empty role and an id
// of at most MaxIDLen bytes.
func (a Address) Validate() error {
	if !isPlain(string(a.Role)) {
		return fmt.Errorf("%w: role %q must be non-empty [A-Za-z0-9_-]", ErrInvalidAddress, a.Role)
	}
	if len(a.ID) > MaxIDLen {
		return fmt.Errorf("%w: id of %d bytes exceeds %d", ErrInvalidAddress, len(a.ID), MaxIDLen)
	}
	return nil
}

// ParseAddress reverses Address.String: "worker/worker-1a2b3c4d", "coordinator/*", or
// "worker/~<base64url>" for an id with characters outside [A-Za-z0-9_-].
func ParseAddress(s string) (Address, error) {
	role, token, ok := strings.Cut(s, "/")
	if !ok {
		return Address{}, fmt.Errorf("%w: %q has no '/'", ErrInvalidAddress, s)
	}
	a := Address{Role: Role(role)}
	if token != anyID {
		id, err := parseIDToken(token)
		if err != nil {
			return Address{}, fmt.Errorf("%w: %q: %w", ErrInvalidAddress, s, err)
		}
		a.ID = id
	}
	if err := a.Validate(); err != nil {
		return Address{}, err
	}
	return a, nil
}

// idToken turns an id into one subject token, reversibly: plain ids stay readable,
// anything else becomes "~" + unpadded base64url, whose alphabet is plain.
func idToken(id string) string {
	if isPlain(id) {
		return id
	}
	return encodedPrefix + base64.RawURLEncoding.EncodeToString([]byte(id))
}

// parseIDToken reverses idToken. It accepts only canonical tokens, so that every id has
// exactly one token and two tokens never name the same node.
func parseIDToken(token string) (string, error) {
	if isPlain(token) {
		if len(token) > MaxIDLen {
			return "", fmt.Errorf("id of %d bytes exceeds %d", len(token), MaxIDLen)
		}
		return token, nil
	}
	enc, ok := strings.CutPrefix(token, encodedPrefix)
	if !ok || !isPlain(enc) {
		return "", fmt.Errorf("id token must be [A-Za-z0-9_-] or %q + base64url", encodedPrefix)
	}
	if base64.RawURLEncoding.DecodedLen(len(enc)) > MaxIDLen {
		return "", fmt.Errorf("encoded id exceeds %d bytes", MaxIDLen)
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(enc)
	if err != nil {
		return "", fmt.Errorf("decode id: %w", err)
	}
	id := string(raw)
	if id == "" || isPlain(id) {
		return "", fmt.Errorf("id token %q is not canonical", token)
	}
	return id, nil
}

// isPlain reports whether s is non-empty and only [A-Za-z0-9_-].
func isPlain(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// validPath reports whether path can end a subject: dot-separated non-empty tokens
// without wildcards, whitespace or control characters.
func validPath(path string) error {
	if path == "" {
		return fmt.Errorf("%w: empty", ErrInvalidPath)
	}
	prev := byte('.')
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case c == '.' && prev == '.':
			return fmt.Errorf("%w: %q has an empty token", ErrInvalidPath, path)
		case c == '*' || c == '>' || c <= ' ' || c == 0x7f:
			return fmt.Errorf("%w: %q contains %q", ErrInvalidPath, path, c)
		}
		prev = c
	}
	if prev == '.' {
		return fmt.Errorf("%w: %q has an empty token", ErrInvalidPath, path)
	}
	return nil
}

// Subject prefixes. docs/PROTOCOL.md ("Names in NATS") documents them; other packages should not build them.
const (
	subjectNode     = "jobbus.node."
	subjectRole     = "jobbus.role."
	subjectPresence = "jobbus.presence."
)

// anySender stands for the sender's two tokens in a handler's subscription: it serves
// every sender, and reads which one sent a message from the subject (sender).
const anySender = "*.*"

// senderTokens is how a node names itself in the subjects it sends to:
// "<role>.<idtoken>". The sender is part of the subject, not a header, so that NATS
// publish permissions vouch for it: a user allowed only
// "jobbus.role.coordinator.worker.edge-1.>" can speak only as worker edge-1.
func senderTokens(a Address) string {
	return string(a.Role) + "." + idToken(a.ID)
}

// subject gives the subject that reaches to with path, sent by from (senderTokens, or
// anySender to subscribe): the node's direct subject
// "jobbus.node.<role>.<idtoken>.<from>.<path>", or the role-wide one
// "jobbus.role.<role>.<from>.<path>" (served in queue group "<role>") when to is any
// node of its role. It is built on every message, so into a stack buffer that only a
// long id or path outgrows: the string is its one allocation.
func subject(to Address, from, path string) string {
	var buf [160]byte
	var b []byte
	if to.ID == "" {
		b = append(buf[:0], subjectRole...)
		b = append(b, to.Role...)
	} else {
		b = append(buf[:0], subjectNode...)
		b = append(b, to.Role...)
		b = append(b, '.')
		b = appendIDToken(b, to.ID)
	}
	b = append(b, '.')
	b = append(b, from...)
	b = append(b, '.')
	b = append(b, path...)
	return string(b)
}

// appendIDToken appends idToken(id) to b.
func appendIDToken(b []byte, id string) []byte {
	if isPlain(id) {
		return append(b, id...)
	}
	b = append(b, encodedPrefix...)
	return base64.RawURLEncoding.AppendEncode(b, []byte(id))
}

// sender reads who sent a message that arrived on subj for path: the two tokens before
// the path (see subject). It accepts only what senderTokens writes, so a peer cannot
// name one sender in two ways.
func sender(subj, path string) (Address, error) {
	end := len(subj) - len(path) - 1
	if end <= 0 || subj[end] != '.' || subj[end+1:] != path {
		return Address{}, fmt.Errorf("%w: subject %q does not end with path %q", ErrInvalidAddress, subj, path)
	}
	rest := subj[:end]
	i := strings.LastIndexByte(rest, '.')
	j := strings.LastIndexByte(rest[:max(i, 0)], '.')
	if i < 0 || j < 0 {
		return Address{}, fmt.Errorf("%w: subject %q names no sender", ErrInvalidAddress, subj)
	}
	role, token := rest[j+1:i], rest[i+1:]
	if !isPlain(role) {
		return Address{}, fmt.Errorf("%w: sender role %q must be [A-Za-z0-9_-]", ErrInvalidAddress, role)
	}
	id, err := parseIDToken(token)
	if err != nil {
		return Address{}, fmt.Errorf("%w: sender in %q: %w", ErrInvalidAddress, subj, err)
	}
	return Address{Role: Role(role), ID: id}, nil
}

// presenceSubject is "jobbus.presence.<role>.<idtoken>".
func presenceSubject(a Address) string {
	return subjectPresence + string(a.Role) + "." + idToken(a.ID)
}
