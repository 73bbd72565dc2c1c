package svc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// SegmentCount is GET /segments/{id} of a segment its probe's caller set with SetSegment: the
// segment with its exact member count (docs/api-contract.md §20.1). It runs on the newsletter
// after the million-row import, with a segment of the 1 % that hold FilteredTag.
const SegmentCount = "segment_count"

const (
	segmentsPath    = "/api/v1/segments"
	bulkActionsPath = "/api/v1/bulk-actions"
)

// SetSegment sets the segment segment_count reads.
func (c *Client) SetSegment(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.segment = id
}

func (c *Client) segmentScenarios() []Scenario {
	return []Scenario{{Name: SegmentCount, Desc: "GET one segment with its exact member count, tags [" + FilteredTag + "] (1 % hold it)",
		Check: checkSegment, req: func(int64) request {
			c.mu.Lock()
			defer c.mu.Unlock()
			return request{method: http.MethodGet, path: segmentsPath + "/" + c.segment, rows: 1}
		}}}
}

// checkSegment validates GET /segments/{id}: a segment with members.
func checkSegment(status int, body []byte) error {
	seg, _, err := decodeData[struct {
		ID          string `json:"id"`
		Subscribers *int64 `json:"subscribers"`
	}](status, 200, body)
	if err == nil && (seg.ID == "" || seg.Subscribers == nil || *seg.Subscribers <= 0) {
		err = fmt.Errorf("not a segment with members: %.300s", body)
	}
	return err
}

// post sends body as JSON to path and returns the data's id, the answer having to be want.
func (c *Client) post(ctx context.Context, path string, body any, want int) (string, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return "", err
	}
	r := c.do(ctx, request{method: http.MethodPost, path: path, body: b}, true)
	if r.err != nil {
		return "", r.err
	}
	out, _, err := decodeData[struct {
		ID string `json:"id"`
	}](r.status, want, r.body)
	if err == nil && out.ID == "" {
		err = fmt.Errorf("no id in %.300s", r.body)
	}
	if err != nil {
		return "", fmt.Errorf("POST %s: %w", path, err)
	}
	return out.ID, nil
}

// CreateSegment makes a segment of filter (a §20.1 filter object) and returns its id.
func (c *Client) CreateSegment(ctx context.Context, name string, filter any) (string, error) {
	return c.post(ctx, segmentsPath, map[string]any{"name": name, "filter": filter}, http.StatusCreated)
}

// CreatePending creates one pending subscriber with address email (which queues its
// confirmation email) and returns its id.
func (c *Client) CreatePending(ctx context.Context, email string) (string, error) {
	return c.post(ctx, subscribersPath, map[string]string{"email": email, "name": "Single Person", "status": "pending"}, http.StatusCreated)
}

// StartBulkAction requests a bulk action (docs/api-contract.md §20.2) and returns its id.
func (c *Client) StartBulkAction(ctx context.Context, body any) (string, error) {
	return c.post(ctx, bulkActionsPath, body, http.StatusAccepted)
}

// BulkAction is a bulk action's state and counts.
type BulkAction struct {
	State  string `json:"state"`
	Counts struct {
		Matched   int64 `json:"matched"`
		Processed int64 `json:"processed"`
		Changed   int64 `json:"changed"`
		Unchanged int64 `json:"unchanged"`
	} `json:"counts"`
}

// GetBulkAction reads bulk action id.
func (c *Client) GetBulkAction(ctx context.Context, id string) (BulkAction, error) {
	a, _, err := get[BulkAction](ctx, c, bulkActionsPath+"/"+id)
	if err == nil && a.State == "" {
		err = errors.New("GET /bulk-actions/{id}: not a bulk action")
	}
	return a, err
}
