//go:build race

package protocol_test

// raceOn: the race detector's instrumentation allocates besides the code under test.
const raceOn = true
