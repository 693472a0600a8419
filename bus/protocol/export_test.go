package protocol

import (
	"maps"
	"slices"
)

// KnownTypes lists every message type Decode accepts, so the tests can check that
// they cover each one.
func KnownTypes() []Type {
	return slices.Sorted(maps.Keys(newMessage))
}
