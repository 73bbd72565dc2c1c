// Package svc drives a running subscriberd over its HTTP API (see docs/api-contract.md): the
// load scenarios of subscriber-bench and the bulk seeding of a newsletter.
package svc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/load"
)

// API paths.
const (
	subscribersPath = "/api/v1/subscribers"
	bulkPath        = "/api/v1/subscribers/bulk"
)

// Scenario names.
const (
	CreateActive  = "create_active"
	CreatePending = "create_pending"
	Bulk100       = "bulk_100"
	ListFirst     = "list_first"
	ListDeep      = "list_deep"
	ListStatus    = "list_status"
	Get           = "get"
	Update        = "update"
	// API 1.1 (docs/api-contract.md §8, §9).
	CreateIdem     = "create_idem"      // create_active with a fresh Idempotency-Key each time
	Replay         = "replay"           // the same create with the same key again: the stored response
	LookupEmail    = "lookup_email"     // GET ?email= of a known subscriber
	ListCursorDeep = "list_cursor_deep" // GET the page after CursorDepth subscribers by cursor
)

// CursorDepth is how many subscribers precede the page of list_cursor_deep.
const CursorDepth = 50000

// PageSize and DeepPage are the page size and the deep page number of the list scenarios.
const (
	PageSize = 25
	DeepPage = 2000
)

// StatusFiltered is the status the filtered-list scenario asks for.
const StatusFiltered = "active"

// BulkSize is the number of subscribers of one bulk create.
const BulkSize = 100

// Client calls one service with one API key. It is safe for concurrent use.
type Client struct {
	base    string
	key     string
	http    *http.Client
	timeout time.Duration
	prefix  string
	seq     atomic.Int64

	// State of the API 1.1 scenarios, set by their probes.
	mu         sync.Mutex
	replayBody []byte   // the create replay sends again
	deepCursor string   // next_cursor after CursorDepth subscribers
	emails     []string // known addresses lookup_email picks from
	segment    string   // the segment segment_count reads (SetSegment)

	// IDs are subscribers of the key's newsletter that get and update pick from.
	IDs []string
}

// NewClient returns a client of the service at base using key, keeping up to conns connections
// alive (at least the most concurrent workers, or they would be reopened under load); timeout
// bounds every request. Emails it creates are unique to runID.
func NewClient(base, key, runID string, conns int, timeout time.Duration) *Client {
	if timeout <= 0 {
		timeout = 20 * time.Second
	}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns + 16,
		MaxIdleConnsPerHost: conns + 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &Client{
		base:    strings.TrimRight(base, "/"),
		key:     key,
		http:    &http.Client{Transport: tr},
		timeout: timeout,
		prefix:  runID,
	}
}

// Email returns a new email unique to this run, in mixed case so that the service's
// case-folding is exercised.
func (c *Client) Email(kind string) string {
	return fmt.Sprintf("%s-%s-%d@Bench.Example.com", kind, c.prefix, c.seq.Add(1))
}

// request is one call of a scenario: rows is what a success counts.
type request struct {
	method, path string
	body         []byte
	idem         string // Idempotency-Key, if any
	rows         int
}

// response is the outcome of one request.
type response struct {
	status int
	body   []byte // kept only when asked for, or for a failure (truncated)
	err    error
}

// do sends one request and reads the whole response, so the connection is reused.
func (c *Client) do(ctx context.Context, q request, keep bool) response {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var rd io.Reader
	if q.body != nil {
		rd = bytes.NewReader(q.body)
	}
	req, err := http.NewRequestWithContext(ctx, q.method, c.base+q.path, rd)
	if err != nil {
		return response{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Accept", "application/json")
	if q.idem != "" {
		req.Header.Set("Idempotency-Key", q.idem)
	}
	if q.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return response{err: err}
	}
	defer resp.Body.Close()
	r := response{status: resp.StatusCode}
	if keep || resp.StatusCode/100 != 2 {
		r.body, r.err = io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	} else {
		_, r.err = io.Copy(io.Discard, resp.Body)
	}
	return r
}

// get reads path, which must answer 200, and decodes its data.
func get[T any](ctx context.Context, c *Client, path string) (T, envelope, error) {
	r := c.do(ctx, request{method: http.MethodGet, path: path}, true)
	if r.err != nil {
		var zero T
		return zero, envelope{}, r.err
	}
	return decodeData[T](r.status, 200, r.body)
}

// page lists one page of subscribers, newest first.
func (c *Client) page(ctx context.Context, page, limit int) ([]Subscriber, envelope, error) {
	return get[[]Subscriber](ctx, c, fmt.Sprintf("%s?page=%d&limit=%d", subscribersPath, page, limit))
}

// result classifies a response as a load.Result: a 2xx is a success of rows rows.
func result(r response, rows int) load.Result {
	if r.err != nil && r.status == 0 {
		kind := "transport"
		var ne net.Error
		if errors.Is(r.err, context.DeadlineExceeded) || (errors.As(r.err, &ne) && ne.Timeout()) {
			kind = "timeout"
		}
		return load.Result{Err: kind, Detail: r.err.Error()}
	}
	if r.status/100 != 2 {
		return load.Result{Err: strconv.Itoa(r.status), Detail: string(r.body[:min(len(r.body), 300)])}
	}
	if r.err != nil {
		return load.Result{Err: "transport", Detail: "reading the body: " + r.err.Error()}
	}
	return load.Result{Rows: rows}
}

// Scenario is one named service operation.
type Scenario struct {
	Name string
	Desc string
	// Write is set for the scenarios that change data.
	Write bool
	Op    load.Op
	// Check validates one full response of the scenario (the probe before a run).
	Check func(status int, body []byte) error
	// setup, when set, finds what the scenario's requests need (a cursor, addresses); the
	// probe runs it.
	setup func(ctx context.Context) error
	req   func(seq int64) request
}

// Scenarios lists every service scenario in running order.
func (c *Client) Scenarios() []Scenario {
	listCheck := func(full bool) func(int, []byte) error {
		return func(status int, body []byte) error { return checkList(status, body, full) }
	}
	get := func(path func() string) func(int64) request {
		return func(int64) request { return request{method: http.MethodGet, path: path(), rows: 1} }
	}
	fixed := func(p string) func() string { return func() string { return p } }
	create := func(status string) func(int64) request {
		return func(seq int64) request {
			return request{method: http.MethodPost, path: subscribersPath, rows: 1,
				body: fmt.Appendf(nil, `{"email":%q,"name":"Bench Person %d","status":%q}`, c.Email("c"), seq, status)}
		}
	}
	scs := []Scenario{
		{Name: ListFirst, Desc: "GET first page of 25", Check: listCheck(true), req: get(fixed(listPath(1, "")))},
		{Name: ListDeep, Desc: fmt.Sprintf("GET page %d of %d", DeepPage, PageSize), Check: listCheck(false), req: get(fixed(listPath(DeepPage, "")))},
		{Name: ListStatus, Desc: "GET first page of 25, status=" + StatusFiltered, Check: listCheck(true), req: get(fixed(listPath(1, StatusFiltered)))},
		{Name: Get, Desc: "GET one subscriber by id", Check: checkOne(200), req: get(func() string { return subscribersPath + "/" + c.pickID() })},
		{Name: Update, Desc: "PUT a new name on one subscriber", Write: true, Check: checkOne(200), req: func(seq int64) request {
			return request{method: http.MethodPut, path: subscribersPath + "/" + c.pickID(), rows: 1, body: fmt.Appendf(nil, `{"name":"Updated Bench %d"}`, seq)}
		}},
		{Name: CreateActive, Desc: "POST one active subscriber", Write: true, Check: checkOne(201), req: create("active")},
		{Name: CreatePending, Desc: "POST one pending subscriber (queues a confirmation email)", Write: true, Check: checkOne(201), req: create("pending")},
		{Name: Bulk100, Desc: "POST /bulk of 100 active subscribers", Write: true, Check: checkBulk, req: func(int64) request {
			return request{method: http.MethodPost, path: bulkPath, body: c.bulkBody("b", BulkSize), rows: BulkSize}
		}},
		{Name: LookupEmail, Desc: "GET ?email= of a known subscriber", Check: checkLookup, setup: c.findEmails, req: get(func() string {
			c.mu.Lock()
			defer c.mu.Unlock()
			var email string
			if len(c.emails) > 0 {
				email = c.emails[rand.IntN(len(c.emails))]
			}
			return subscribersPath + "?email=" + url.QueryEscape(strings.ToUpper(email)) // in another case than stored
		})},
		{Name: ListCursorDeep, Desc: fmt.Sprintf("GET the page of %d after %d subscribers, by cursor", PageSize, CursorDepth), Check: listCheck(true),
			setup: c.findCursor, req: get(func() string {
				c.mu.Lock()
				defer c.mu.Unlock()
				return fmt.Sprintf("%s?limit=%d&cursor=%s", subscribersPath, PageSize, url.QueryEscape(c.deepCursor))
			})},
		// The same create again with the same key: every answer is the stored response.
		{Name: Replay, Desc: "POST one create again with its Idempotency-Key (the stored response)", Check: checkOne(201), req: func(int64) request {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.replayBody == nil {
				c.replayBody = fmt.Appendf(nil, `{"email":%q,"name":"Replay Person","status":"active"}`, c.Email("r"))
			}
			return request{method: http.MethodPost, path: subscribersPath, body: c.replayBody, idem: "bench-replay-" + c.prefix, rows: 1}
		}},
		{Name: CreateIdem, Desc: "POST one active subscriber with a fresh Idempotency-Key", Write: true, Check: checkOne(201), req: func(seq int64) request {
			q := create("active")(seq)
			q.idem = fmt.Sprintf("bench-%s-%d", c.prefix, c.seq.Add(1))
			return q
		}},
	}
	scs = append(scs, c.attrScenarios()...)    // API 1.3 (attrs.go)
	scs = append(scs, c.segmentScenarios()...) // API 1.3 (bulk.go)
	for i := range scs {
		req := scs[i].req
		scs[i].Op = func(ctx context.Context, _ int, seq int64) load.Result {
			q := req(seq)
			return result(c.do(ctx, q, false), q.rows)
		}
	}
	return scs
}

// Probe runs sc once (after its setup), reading the whole response, and validates it with
// sc.Check.
func (c *Client) Probe(ctx context.Context, sc Scenario) error {
	if sc.setup != nil {
		if err := sc.setup(ctx); err != nil {
			return err
		}
	}
	r := c.do(ctx, sc.req(0), true)
	if r.err != nil {
		return r.err
	}
	return sc.Check(r.status, r.body)
}

// findEmails collects known addresses for lookup_email, from the middle of the seeded table.
func (c *Client) findEmails(ctx context.Context) error {
	var subs []Subscriber
	for _, page := range []int{CursorDepth / 100 / 2, 1} {
		var err error
		if subs, _, err = c.page(ctx, page, 100); err != nil {
			return err
		}
		if len(subs) > 0 {
			break
		}
	}
	if len(subs) == 0 {
		return errors.New("no subscribers to look up")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.emails = c.emails[:0]
	for _, s := range subs {
		c.emails = append(c.emails, s.Email)
	}
	return nil
}

// findCursor finds the cursor after CursorDepth subscribers (or the first page) for
// list_cursor_deep.
func (c *Client) findCursor(ctx context.Context) error {
	for _, page := range []int{CursorDepth / PageSize, 1} {
		_, env, err := c.page(ctx, page, PageSize)
		if err != nil {
			return err
		}
		if env.Pagination != nil && env.Pagination.NextCursor != nil {
			c.mu.Lock()
			c.deepCursor = *env.Pagination.NextCursor
			c.mu.Unlock()
			return nil
		}
	}
	return errors.New("no next_cursor on the list")
}

// checkLookup validates a lookup: one subscriber, total 1.
func checkLookup(status int, body []byte) error {
	subs, env, err := decodeData[[]Subscriber](status, 200, body)
	if err != nil {
		return err
	}
	if len(subs) != 1 || env.Pagination == nil || env.Pagination.Total != 1 {
		return fmt.Errorf("lookup found %d subscribers: %.300s", len(subs), body)
	}
	return subs[0].check()
}

func listPath(page int, status string) string {
	p := fmt.Sprintf("%s?page=%d&limit=%d", subscribersPath, page, PageSize)
	if status != "" {
		p += "&status=" + status
	}
	return p
}

func (c *Client) pickID() string {
	if len(c.IDs) == 0 {
		return "00000000-0000-7000-8000-000000000000"
	}
	return c.IDs[rand.IntN(len(c.IDs))]
}

// bulkBody is a bulk create of n active subscribers with new emails.
func (c *Client) bulkBody(kind string, n int) []byte {
	b := make([]byte, 0, n*80)
	b = append(b, '[')
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		seq := c.seq.Add(1)
		b = fmt.Appendf(b, `{"email":"%s-%s-%d@Bench.Example.com","name":"Bulk Person %d","status":"active"}`, kind, c.prefix, seq, seq)
	}
	return append(b, ']')
}

// envelope is the success envelope of the API.
type envelope struct {
	Success    bool            `json:"success"`
	Data       json.RawMessage `json:"data"`
	Pagination *struct {
		Page  int   `json:"page"`
		Limit int   `json:"limit"`
		Total int64 `json:"total"`
		Pages int64 `json:"pages"`
		// NextCursor is set on a page that has a next one.
		NextCursor *string `json:"next_cursor"`
	} `json:"pagination"`
}

// Subscriber is the API's Subscriber resource.
type Subscriber struct {
	ID        string `json:"id"`
	Email     string `json:"email"`
	Name      string `json:"name"`
	Status    string `json:"status"`
	CreatedAt string `json:"created_at"`
}

func decode(status, want int, body []byte) (envelope, error) {
	var env envelope
	if status != want {
		return env, fmt.Errorf("status %d, want %d: %.300s", status, want, body)
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return env, fmt.Errorf("body is not the JSON envelope: %v: %.300s", err, body)
	}
	if !env.Success {
		return env, fmt.Errorf("success is not true: %.300s", body)
	}
	return env, nil
}

// decodeData decodes the envelope of an answer that must be want, and its data as a T.
func decodeData[T any](status, want int, body []byte) (T, envelope, error) {
	var v T
	env, err := decode(status, want, body)
	if err == nil && json.Unmarshal(env.Data, &v) != nil {
		err = fmt.Errorf("data is not a %T: %.300s", v, body)
	}
	return v, env, err
}

func (s Subscriber) check() error {
	if s.ID == "" || s.Email == "" || s.Status == "" || s.CreatedAt == "" {
		return fmt.Errorf("subscriber lacks id, email, status or created_at: %+v", s)
	}
	return nil
}

func checkOne(want int) func(int, []byte) error {
	return func(status int, body []byte) error {
		s, _, err := decodeData[Subscriber](status, want, body)
		if err != nil {
			return err
		}
		return s.check()
	}
}

// checkList validates a list page; full asks for a full page of PageSize.
func checkList(status int, body []byte, full bool) error {
	subs, env, err := decodeData[[]Subscriber](status, 200, body)
	if err != nil {
		return err
	}
	if env.Pagination == nil {
		return errors.New("no pagination")
	}
	if env.Pagination.Limit != PageSize || env.Pagination.Total <= 0 {
		return fmt.Errorf("pagination %+v: want limit %d and a positive total", *env.Pagination, PageSize)
	}
	if full && len(subs) != PageSize {
		return fmt.Errorf("%d subscribers on the page, want %d", len(subs), PageSize)
	}
	if !full && int64(env.Pagination.Page) <= env.Pagination.Pages && len(subs) != PageSize {
		return fmt.Errorf("%d subscribers on page %d of %d", len(subs), env.Pagination.Page, env.Pagination.Pages)
	}
	for _, s := range subs {
		if err := s.check(); err != nil {
			return err
		}
	}
	return nil
}

func checkBulk(status int, body []byte) error {
	_, err := bulkCreated(status, body, BulkSize)
	return err
}

// bulkCreated returns the ids a bulk create answered with, checking there are n.
func bulkCreated(status int, body []byte, n int) ([]string, error) {
	data, _, err := decodeData[struct {
		Created []Subscriber `json:"created"`
	}](status, 201, body)
	if err != nil {
		return nil, err
	}
	if len(data.Created) != n {
		return nil, fmt.Errorf("%d created, want %d", len(data.Created), n)
	}
	ids := make([]string, n)
	for i, s := range data.Created {
		if err := s.check(); err != nil {
			return nil, err
		}
		ids[i] = s.ID
	}
	return ids, nil
}

// Seed creates n active subscribers with bulk requests of up to 100 from parallel workers and
// returns their ids. progress, when not nil, is called with the running total after each bulk.
func (c *Client) Seed(ctx context.Context, n, parallel int, progress func(done int)) ([]string, error) {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(parallel, 1))
	var mu sync.Mutex
	ids := make([]string, 0, n)
	for done := 0; done < n && gctx.Err() == nil; done += BulkSize {
		size := min(BulkSize, n-done)
		g.Go(func() error {
			r := c.do(gctx, request{method: http.MethodPost, path: bulkPath, body: c.bulkBody("seed", size)}, true)
			if r.err != nil {
				return fmt.Errorf("seed bulk: %w", r.err)
			}
			got, err := bulkCreated(r.status, r.body, size)
			if err != nil {
				return fmt.Errorf("seed bulk: %w", err)
			}
			mu.Lock()
			ids = append(ids, got...)
			done := len(ids)
			mu.Unlock()
			if progress != nil {
				progress(done)
			}
			return nil
		})
	}
	err := g.Wait()
	if err == nil {
		err = ctx.Err() // cancelled between two bulks
	}
	return ids, err
}

// ListIDs returns up to n subscriber ids of the newsletter, newest first.
func (c *Client) ListIDs(ctx context.Context, n int) ([]string, error) {
	var ids []string
	for page := 1; len(ids) < n; page++ {
		subs, _, err := c.page(ctx, page, 100)
		if err != nil || len(subs) == 0 {
			return ids, err
		}
		for _, s := range subs {
			ids = append(ids, s.ID)
		}
	}
	return ids[:n], nil
}

// Total returns the newsletter's subscriber total.
func (c *Client) Total(ctx context.Context) (int64, error) {
	_, env, err := get[json.RawMessage](ctx, c, subscribersPath+"?page=1&limit=1")
	if err != nil {
		return 0, err
	}
	if env.Pagination == nil {
		return 0, errors.New("list without pagination")
	}
	return env.Pagination.Total, nil
}

// Import is an import's state and counts (docs/api-contract.md §15).
type Import struct {
	State  string `json:"state"`
	Counts struct {
		Created int64 `json:"created"`
	} `json:"counts"`
}

// GetImport reads import id.
func (c *Client) GetImport(ctx context.Context, id string) (Import, error) {
	imp, _, err := get[Import](ctx, c, "/api/v1/imports/"+id)
	return imp, err
}

// CreateWebhook makes a webhook endpoint for url subscribed to every event type and returns
// its id.
func (c *Client) CreateWebhook(ctx context.Context, url string) (string, error) {
	body, _ := json.Marshal(map[string]string{"url": url})
	r := c.do(ctx, request{method: http.MethodPost, path: "/api/v1/webhooks", body: body}, true)
	if r.err != nil {
		return "", r.err
	}
	if r.status != http.StatusCreated {
		return "", fmt.Errorf("POST /webhooks: %d %s", r.status, r.body)
	}
	var env struct {
		Data struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(r.body, &env); err != nil || env.Data.ID == "" {
		return "", fmt.Errorf("POST /webhooks: no id in %s", r.body)
	}
	return env.Data.ID, nil
}

// DeleteWebhook deletes the endpoint id (and drops its undelivered events).
func (c *Client) DeleteWebhook(ctx context.Context, id string) error {
	r := c.do(ctx, request{method: http.MethodDelete, path: "/api/v1/webhooks/" + id}, false)
	if r.err != nil {
		return r.err
	}
	if r.status != http.StatusOK {
		return fmt.Errorf("DELETE /webhooks/%s: %d", id, r.status)
	}
	return nil
}
