package coordinator

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// readRecord reads the record stored last under key id. A KV get is a direct get,
// which any replica of a replicated stream answers: one that has not yet applied the
// latest write answers with an older record or none, so a job that had just finished
// (and left memory) was "Unknown job" to its waiting client. In a cluster the record is
// read from the stream's leader instead, which has every write it acknowledged.
func (c *Coordinator) readRecord(ctx context.Context, id string) ([]byte, error) {
	data, _, err := c.readRecordAt(ctx, id)
	return data, err
}

// readRecordAt is readRecord with the revision (stream sequence) of what it read.
func (c *Coordinator) readRecordAt(ctx context.Context, id string) ([]byte, uint64, error) {
	if c.stream == nil || c.stream.CachedInfo().Config.Replicas <= 1 {
		e, err := c.jobsKV.Get(ctx, id)
		if err != nil {
			return nil, 0, err
		}
		return e.Value(), e.Revision(), nil
	}
	req, err := json.Marshal(struct {
		LastBySubject string `json:"last_by_subj"`
	}{"$KV." + protocol.JobsBucket + "." + id})
	if err != nil {
		return nil, 0, err
	}
	m, err := c.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+c.stream.CachedInfo().Config.Name, req)
	if err != nil {
		return nil, 0, err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Seq    uint64 `json:"seq"`
			Header []byte `json:"hdrs"`
			Data   []byte `json:"data"`
		} `json:"message"`
	}
	switch err := json.Unmarshal(m.Data, &resp); {
	case err != nil:
		return nil, 0, fmt.Errorf("read %s: %w", id, err)
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, 0, jetstream.ErrKeyNotFound
	case resp.Error != nil:
		return nil, 0, resp.Error
	case resp.Message == nil:
		return nil, 0, fmt.Errorf("read %s: no message in %q", id, m.Data)
	}
	if len(resp.Message.Header) > 0 {
		// A delete or purge marker, or JetStream's marker of an expired record.
		h, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if op := h.Get("KV-Operation"); err == nil && (op == "DEL" || op == "PURGE" || h.Get("Nats-Marker-Reason") != "") {
			return nil, 0, jetstream.ErrKeyDeleted
		}
	}
	return resp.Message.Data, resp.Message.Seq, nil
}
