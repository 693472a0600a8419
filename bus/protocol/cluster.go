package protocol

// Presence: what `jobbus cluster` asks every coordinator and every embedded server.
// Each answers a request on its subject (no queue group, so all answer); the asker
// gathers the replies for a moment (scatter-gather, like `nats micro ping`). A paused or
// dead process does not answer, which is the truth about it.
const (
	// CoordinatorsSubject is answered by every coordinator process with a Coordinator.
	CoordinatorsSubject = "jobbus.cluster.coordinators"
	// ServersSubject is answered by every embedded server (`jobbus serve`) with a Server.
	ServersSubject = "jobbus.cluster.servers"
)

// Coordinator states.
const (
	CoordinatorLeading = "leading"
	CoordinatorStandby = "standby"
)

// Coordinator is one coordinator process as it sees itself.
type Coordinator struct {
	ID string `json:"id"`
	// State is CoordinatorLeading or CoordinatorStandby.
	State string `json:"state"`
	// Since is when it entered State, in Unix milliseconds.
	Since int64 `json:"since"`
	// Started is when the process began campaigning, in Unix milliseconds.
	Started int64 `json:"started"`
	// Server is the NATS server it is connected to (name, else URL).
	Server  string `json:"server,omitempty"`
	Host    string `json:"host,omitempty"`
	PID     int    `json:"pid,omitempty"`
	Version string `json:"version,omitempty"`
}

// Server is an embedded NATS server's view of itself and of its cluster.
type Server struct {
	Name    string `json:"name"`
	Cluster string `json:"cluster,omitempty"`
	URL     string `json:"url,omitempty"`
	// Routes are the names of the servers routed to this one.
	Routes []string `json:"routes,omitempty"`
	// Leafnodes are the names of the leaf nodes connected to this one.
	Leafnodes []string `json:"leafnodes,omitempty"`
	// JetStream is false on a leaf node that uses its hub's.
	JetStream bool `json:"jetstream"`
	// MetaLeader is the server that leads JetStream's meta group, as this one sees it.
	MetaLeader string `json:"metaLeader,omitempty"`
	// Peers are the meta group's other servers with their currency, as seen by the meta
	// leader (empty on the others).
	Peers []Peer `json:"peers,omitempty"`
}

// Peer is one replica of a RAFT group (JetStream's meta group, or a bucket's stream).
type Peer struct {
	Name    string `json:"name"`
	Current bool   `json:"current"`
	Offline bool   `json:"offline,omitempty"`
	// ActiveMillis is how long ago the leader last heard from it.
	ActiveMillis int64 `json:"activeMillis"`
	// Lag is how many operations it is behind.
	Lag uint64 `json:"lag"`
}

// LeaderKey is the key of the leader lease in LeaderBucket; its value is the leading
// coordinator's id.
const LeaderKey = "coordinator"
