package client

import (
	"context"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TaskTypes lists the coordinator's task types (a jobbus extension, also served on the
// TCP client port): the built-ins, then the catalogue of the types workers declared,
// each with the workers serving it now and its queued and running jobs.
func (c *Client) TaskTypes(ctx context.Context) ([]protocol.TaskTypeInfo, error) {
	r, err := answer[protocol.TaskTypeList](ctx, c, &protocol.ListTaskTypes{})
	if err != nil {
		return nil, err
	}
	return r.TaskTypes, nil
}
