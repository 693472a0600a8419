package bus

// Add adds o's counts to s, so that a process can report the nodes it runs (and those
// it ran: a closed node's last snapshot) as one. InFlight adds up too.
func (s *Stats) Add(o Stats) {
	addKinds := func(a *KindCounts, b KindCounts) {
		a.Tell += b.Tell
		a.Ask += b.Ask
		a.Response += b.Response
		a.Error += b.Error
		a.Heartbeat += b.Heartbeat
	}
	addKinds(&s.Sent, o.Sent)
	addKinds(&s.Received, o.Received)
	s.BytesSent += o.BytesSent
	s.BytesReceived += o.BytesReceived
	s.Asks.OK += o.Asks.OK
	s.Asks.RemoteError += o.Asks.RemoteError
	s.Asks.Timeout += o.Asks.Timeout
	s.Asks.NoPeer += o.Asks.NoPeer
	s.Asks.Disconnected += o.Asks.Disconnected
	s.Asks.Failed += o.Asks.Failed
	if len(s.AskLatency) == 0 && len(o.AskLatency) > 0 {
		s.AskLatency = make([]LatencyBucket, len(o.AskLatency))
		for i, b := range o.AskLatency {
			s.AskLatency[i].UpTo = b.UpTo
		}
	}
	for i := range min(len(s.AskLatency), len(o.AskLatency)) {
		s.AskLatency[i].Count += o.AskLatency[i].Count
	}
	s.AskLatencySum += o.AskLatencySum
	s.Reconnects += o.Reconnects
	s.Disconnects += o.Disconnects
	s.HandlerErrors += o.HandlerErrors
	s.HandlerPanics += o.HandlerPanics
	s.Dropped += o.Dropped
	s.InFlight += o.InFlight
}

// Done is closed once the node starts closing.
func (n *Node) Done() <-chan struct{} { return n.ctx.Done() }
