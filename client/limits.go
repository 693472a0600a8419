package client

import (
	"context"
	"fmt"

	"github.com/jobbus/jobbus/bus/protocol"
)

// Rate limits (a jobbus extension): at most a rate of starts for the jobs of a task
// type or of a queue, enforced by the leading coordinator as a token bucket. Jobs over
// the limit wait QUEUED; none fails for it.

// LimitTarget names what a limit applies to: ForTaskType or ForQueue.
type LimitTarget struct{ Scope, Name string }

// ForTaskType is the target of a limit on every job of task type name.
func ForTaskType(name string) LimitTarget { return LimitTarget{protocol.LimitTaskType, name} }

// ForQueue is the target of a limit on every job of queue name.
func ForQueue(name string) LimitTarget { return LimitTarget{protocol.LimitQueue, name} }

// SetLimit creates or replaces the limit on target: rate as protocol.ParseRate reads it
// ("100/s", "100/m", "10/30s"), burst the most starts that may follow one another at
// once (0: 1). It returns the limit's state once the setting is durable. A rate it
// cannot read is an error before anything is sent (errors.Is protocol.ErrBadLimit).
func (c *Client) SetLimit(ctx context.Context, target LimitTarget, rate string, burst int64) (protocol.LimitInfo, error) {
	return c.setLimit(ctx, &protocol.SetLimit{Scope: target.Scope, Name: target.Name, Rate: rate, Burst: burst})
}

func (c *Client) setLimit(ctx context.Context, req *protocol.SetLimit) (protocol.LimitInfo, error) {
	if _, _, err := req.Check(); err != nil {
		return protocol.LimitInfo{}, err
	}
	m, err := c.Do(ctx, req)
	if err != nil {
		return protocol.LimitInfo{}, err
	}
	if r, ok := m.(*protocol.LimitList); ok && len(r.Limits) == 1 {
		return r.Limits[0], nil
	}
	return protocol.LimitInfo{}, unexpected(m)
}

// SetLimitRate sets the rate of the limit on target and keeps its burst (1 for a new
// limit), as SetLimit does otherwise. The coordinator reads the burst as it writes, so
// a burst another sets meanwhile is kept, not overwritten by one read before.
func (c *Client) SetLimitRate(ctx context.Context, target LimitTarget, rate string) (protocol.LimitInfo, error) {
	return c.setLimit(ctx, &protocol.SetLimit{Scope: target.Scope, Name: target.Name, Rate: rate, KeepBurst: true})
}

// RemoveLimit removes the limit on target and returns its last state; removing one
// that is not set is a ServerError ("Unknown limit: ...").
func (c *Client) RemoveLimit(ctx context.Context, target LimitTarget) (protocol.LimitInfo, error) {
	if err := protocol.CheckLimitTarget(target.Scope, target.Name); err != nil {
		return protocol.LimitInfo{}, err
	}
	r, err := answer[protocol.LimitRemoved](ctx, c, &protocol.RemoveLimit{Scope: target.Scope, Name: target.Name})
	if err != nil {
		return protocol.LimitInfo{}, err
	}
	return r.Limit, nil
}

// Limits lists every limit with its state on the leading coordinator: rate, burst,
// tokens now and the starts that waited for a token.
func (c *Client) Limits(ctx context.Context) ([]protocol.LimitInfo, error) {
	r, err := answer[protocol.LimitList](ctx, c, &protocol.ListLimits{})
	if err != nil {
		return nil, err
	}
	return r.Limits, nil
}

// String is how the CLI and logs name a target: "type SEND_EMAIL", "queue low".
func (t LimitTarget) String() string { return fmt.Sprintf("%s %s", t.Scope, t.Name) }
