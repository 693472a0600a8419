// Package suite is jobbus's lifecycle conformance suite, written once and run over
// every transport by which clients and workers reach the coordinator: natively over
// NATS, through the bridge's spec TCP ports, or a mix. Neither side may be able to
// tell. As Watermill's pubsub/tests.TestPubSub does for its backends, a Transport
// names how to make a client, a worker and a test-driven peer, and its Features
// declare where transports differ, so the differences are stated, not discovered.
//
// The coordinator's suite runs it over the native transport and the mixes, the
// bridge's over TCP:
//
//	func TestLifecycle(t *testing.T) { suite.RunLifecycle(t, suite.TCP) }
//
// The harness the suite is written in (Setup, System and Peer) is exported too, so a
// package's own tests can drive the same system.
package suite

import (
	"testing"

	"github.com/jobbus/jobbus/client"
)

// Features are a transport's declared differences.
type Features struct {
	// Bridged: clients or workers go through a bridge, which Setup starts.
	Bridged bool
	// ResultAcks: a worker's TASK_RESULT is answered with a RESULT_ACK (the bus does;
	// the spec worker port has no such message), so a test knows at once whether a
	// result counted. Without it the suite watches the job instead.
	ResultAcks bool
}

// Transport is how clients and workers reach the coordinator in a test.
type Transport struct {
	Name     string
	Features Features
	// Client makes the client the tests submit, wait and cancel with.
	Client func(s *System) *client.Client
	// Worker runs a real worker with capacity slots until stop is called.
	Worker func(s *System, capacity int) (w Runner, stop func())
	// Peer makes a test-driven worker with id; the suite registers it.
	Peer func(s *System, id string) Peer
}

// The transports.
var (
	// Native: the Go client and native workers on NATS.
	Native = Transport{Name: "Native", Features: Features{ResultAcks: true},
		Client: natsClient, Worker: nativeWorker, Peer: newBusPeer}
	// TCP: the bridge's client and worker ports, spoken by client.DialTCP, tcpworker and
	// a spec peer.
	TCP = Transport{Name: "TCP", Features: Features{Bridged: true},
		Client: tcpClient, Worker: tcpWorker, Peer: newTCPPeer}
	// TCPClientNativeWorkers: a TCP client with native workers.
	TCPClientNativeWorkers = Transport{Name: "TCPClientNativeWorkers", Features: Features{Bridged: true, ResultAcks: true},
		Client: tcpClient, Worker: nativeWorker, Peer: newBusPeer}
	// NativeClientTCPWorkers: a native client with TCP workers.
	NativeClientTCPWorkers = Transport{Name: "NativeClientTCPWorkers", Features: Features{Bridged: true},
		Client: natsClient, Worker: tcpWorker, Peer: newTCPPeer}
)

// Transports lists every transport.
func Transports() []Transport {
	return []Transport{Native, TCP, TCPClientNativeWorkers, NativeClientTCPWorkers}
}

// lifecycle is the suite: each test gets a system of its own.
var lifecycle = []struct {
	name string
	test func(t *testing.T, tr Transport)
}{
	{"Execution", testExecution},
	{"ValidationErrors", testValidationErrors},
	{"JobsSpreadOverWorkers", testJobsSpreadOverWorkers},
	{"WorkerLoss", testWorkerLoss},
	{"Retries", testRetries},
	{"StaleResults", testStaleResults},
	{"Deadline", testDeadline},
	{"Cancel", testCancel},
	{"CancelRetryWait", testCancelRetryWait},
	{"SchedulingSafety", testSchedulingSafety},
	{"AdmissionControl", testAdmissionControl},
	{"Idempotency", testIdempotency},
	{"ListIsBounded", testListIsBounded},
	{"Restart", testRestart},
	{"PriorityOrder", testPriorityOrder},
	{"Delayed", testDelayed}, // delayed.go
	{"Snooze", testSnooze},
}

// RunLifecycle runs the lifecycle suite over tr, each test as a parallel subtest named
// for the behaviour it checks.
func RunLifecycle(t *testing.T, tr Transport) {
	t.Helper()
	for _, lt := range lifecycle {
		t.Run(lt.name, func(t *testing.T) {
			t.Parallel()
			lt.test(t, tr)
		})
	}
}
