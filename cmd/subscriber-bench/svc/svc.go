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

	// IDs are subscribers of the key's newsletter that get and update pick from.
	IDs []string
}

// NewClient returns a client of the service at base (such as "http://127.0.0.1:8080") using
// key. conns is the most connections kept alive to the service: at least the largest number of
// concurrent workers, or connections would be closed and reopened under load. timeout bounds
// every request. Emails it creates are unique to runID.
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

// response is the outcome of one request.
type response struct {
	status int
	body   []byte // kept only when asked for, or for a failure (truncated)
	err    error
}

// do sends one request and reads the whole response, so the connection is reused.
func (c *Client) do(ctx context.Context, method, path string, body []byte, keep bool) response {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return response{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Accept", "application/json")
	if k, ok := ctx.Value(idemKey{}).(string); ok {
		req.Header.Set("Idempotency-Key", k)
	}
	if body != nil {
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
		detail := string(r.body)
		if len(detail) > 300 {
			detail = detail[:300]
		}
		return load.Result{Err: strconv.Itoa(r.status), Detail: detail}
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
}

// Scenarios lists every service scenario in running order.
func (c *Client) Scenarios() []Scenario {
	listCheck := func(full bool) func(int, []byte) error {
		return func(status int, body []byte) error { return checkList(status, body, full) }
	}
	return []Scenario{
		{ListFirst, "GET first page of 25", false, c.getOp(listPath(1, "")), listCheck(true)},
		{ListDeep, fmt.Sprintf("GET page %d of %d", DeepPage, PageSize), false, c.getOp(listPath(DeepPage, "")), listCheck(false)},
		{ListStatus, "GET first page of 25, status=" + StatusFiltered, false, c.getOp(listPath(1, StatusFiltered)), listCheck(true)},
		{Get, "GET one subscriber by id", false, c.GetOp(), checkOne(200)},
		{Update, "PUT a new name on one subscriber", true, c.UpdateOp(), checkOne(200)},
		{CreateActive, "POST one active subscriber", true, c.CreateOp("active"), checkOne(201)},
		{CreatePending, "POST one pending subscriber (queues a confirmation email)", true, c.CreateOp("pending"), checkOne(201)},
		{Bulk100, "POST /bulk of 100 active subscribers", true, c.BulkOp(), checkBulk},
		{LookupEmail, "GET ?email= of a known subscriber", false, c.lookupOp(), checkLookup},
		{ListCursorDeep, fmt.Sprintf("GET the page of %d after %d subscribers, by cursor", PageSize, CursorDepth), false, c.cursorOp(), listCheck(true)},
		{Replay, "POST one create again with its Idempotency-Key (the stored response)", false, c.replayOp(), checkOne(201)},
		{CreateIdem, "POST one active subscriber with a fresh Idempotency-Key", true, c.createIdemOp(), checkOne(201)},
	}
}

// idemKey is the context key of the Idempotency-Key do sends.
type idemKey struct{}

func withIdem(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, idemKey{}, key)
}

// createIdemOp is CreateOp("active") with a new Idempotency-Key each time.
func (c *Client) createIdemOp() load.Op {
	return func(ctx context.Context, _ int, seq int64) load.Result {
		body := fmt.Appendf(nil, `{"email":%q,"name":"Bench Person %d","status":"active"}`, c.Email("i"), seq)
		return result(c.do(withIdem(ctx, fmt.Sprintf("bench-%s-%d", c.prefix, c.seq.Add(1))), http.MethodPost, subscribersPath, body, false), 1)
	}
}

// replayKey is the Idempotency-Key of the replay scenario's stored create.
func (c *Client) replayKey() string { return "bench-replay-" + c.prefix }

// replayOp sends the probe's create again with its key: every answer is the stored response.
func (c *Client) replayOp() load.Op {
	return func(ctx context.Context, _ int, _ int64) load.Result {
		c.mu.Lock()
		body := c.replayBody
		c.mu.Unlock()
		return result(c.do(withIdem(ctx, c.replayKey()), http.MethodPost, subscribersPath, body, false), 1)
	}
}

// lookupOp looks a random known address up, in another case than stored.
func (c *Client) lookupOp() load.Op {
	return func(ctx context.Context, _ int, _ int64) load.Result {
		c.mu.Lock()
		var email string
		if len(c.emails) > 0 {
			email = c.emails[rand.IntN(len(c.emails))]
		}
		c.mu.Unlock()
		return result(c.do(ctx, http.MethodGet, subscribersPath+"?email="+url.QueryEscape(strings.ToUpper(email)), nil, false), 1)
	}
}

// cursorOp gets the page after CursorDepth subscribers with the cursor its probe found.
func (c *Client) cursorOp() load.Op {
	return func(ctx context.Context, _ int, _ int64) load.Result {
		c.mu.Lock()
		cur := c.deepCursor
		c.mu.Unlock()
		return result(c.do(ctx, http.MethodGet, cursorPath(cur), nil, false), 1)
	}
}

func cursorPath(cur string) string {
	return fmt.Sprintf("%s?limit=%d&cursor=%s", subscribersPath, PageSize, url.QueryEscape(cur))
}

// checkLookup validates a lookup: one subscriber, total 1.
func checkLookup(status int, body []byte) error {
	env, err := decode(status, 200, body)
	if err != nil {
		return err
	}
	var subs []Subscriber
	if err := json.Unmarshal(env.Data, &subs); err != nil {
		return fmt.Errorf("data is not a list of subscribers: %v", err)
	}
	if len(subs) != 1 || env.Pagination == nil || env.Pagination.Total != 1 {
		return fmt.Errorf("lookup found %d subscribers: %.300s", len(subs), body)
	}
	return subs[0].check()
}

// probe11 prepares and checks the API 1.1 scenarios: it stores the replayed create, finds
// the deep cursor, and collects known addresses.
func (c *Client) probe11(ctx context.Context, name string) (int, []byte, error) {
	switch name {
	case Replay:
		c.mu.Lock()
		if c.replayBody == nil {
			c.replayBody = fmt.Appendf(nil, `{"email":%q,"name":"Replay Person","status":"active"}`, c.Email("r"))
		}
		body := c.replayBody
		c.mu.Unlock()
		r := c.do(withIdem(ctx, c.replayKey()), http.MethodPost, subscribersPath, body, true)
		return r.status, r.body, r.err
	case LookupEmail:
		// Addresses from the middle of the seeded table (the newest when it is small).
		var subs []Subscriber
		for _, page := range []int{CursorDepth / 100 / 2, 1} {
			r := c.do(ctx, http.MethodGet, fmt.Sprintf("%s?page=%d&limit=100", subscribersPath, page), nil, true)
			if r.err != nil {
				return 0, nil, r.err
			}
			env, err := decode(r.status, 200, r.body)
			if err != nil {
				return 0, nil, err
			}
			if err := json.Unmarshal(env.Data, &subs); err != nil {
				return 0, nil, fmt.Errorf("data is not a list of subscribers: %v", err)
			}
			if len(subs) > 0 {
				break
			}
		}
		if len(subs) == 0 {
			return 0, nil, errors.New("no subscribers to look up")
		}
		c.mu.Lock()
		c.emails = c.emails[:0]
		for _, s := range subs {
			c.emails = append(c.emails, s.Email)
		}
		c.mu.Unlock()
		r := c.do(ctx, http.MethodGet, subscribersPath+"?email="+url.QueryEscape(subs[0].Email), nil, true)
		return r.status, r.body, r.err
	case ListCursorDeep:
		// The cursor after CursorDepth subscribers (after the first page on a smaller table).
		var next *string
		for _, page := range []int{CursorDepth / PageSize, 1} {
			r := c.do(ctx, http.MethodGet, fmt.Sprintf("%s?page=%d&limit=%d", subscribersPath, page, PageSize), nil, true)
			if r.err != nil {
				return 0, nil, r.err
			}
			var env struct {
				Pagination struct {
					NextCursor *string `json:"next_cursor"`
				} `json:"pagination"`
			}
			if err := json.Unmarshal(r.body, &env); err != nil {
				return 0, nil, fmt.Errorf("list body: %v: %.300s", err, r.body)
			}
			if next = env.Pagination.NextCursor; next != nil {
				break
			}
		}
		if next == nil {
			return 0, nil, errors.New("no next_cursor on the list")
		}
		c.mu.Lock()
		c.deepCursor = *next
		c.mu.Unlock()
		r := c.do(ctx, http.MethodGet, cursorPath(*next), nil, true)
		return r.status, r.body, r.err
	case CreateIdem:
		r := c.do(withIdem(ctx, "bench-probe-"+c.Email("k")), http.MethodPost, subscribersPath,
			fmt.Appendf(nil, `{"email":%q,"name":"Probe Person","status":"active"}`, c.Email("p")), true)
		return r.status, r.body, r.err
	}
	return 0, nil, fmt.Errorf("no probe for scenario %q", name)
}

func listPath(page int, status string) string {
	p := fmt.Sprintf("%s?page=%d&limit=%d", subscribersPath, page, PageSize)
	if status != "" {
		p += "&status=" + status
	}
	return p
}

func (c *Client) getOp(path string) load.Op {
	return func(ctx context.Context, _ int, _ int64) load.Result {
		return result(c.do(ctx, http.MethodGet, path, nil, false), 1)
	}
}

func (c *Client) pickID() string {
	if len(c.IDs) == 0 {
		return "00000000-0000-7000-8000-000000000000"
	}
	return c.IDs[rand.IntN(len(c.IDs))]
}

// GetOp gets a random known subscriber.
func (c *Client) GetOp() load.Op {
	return func(ctx context.Context, _ int, _ int64) load.Result {
		return result(c.do(ctx, http.MethodGet, subscribersPath+"/"+c.pickID(), nil, false), 1)
	}
}

// UpdateOp renames a random known subscriber.
func (c *Client) UpdateOp() load.Op {
	return func(ctx context.Context, _ int, seq int64) load.Result {
		body := fmt.Appendf(nil, `{"name":"Updated Bench %d"}`, seq)
		return result(c.do(ctx, http.MethodPut, subscribersPath+"/"+c.pickID(), body, false), 1)
	}
}

// CreateOp creates one subscriber of the given status with a new email.
func (c *Client) CreateOp(status string) load.Op {
	return func(ctx context.Context, _ int, seq int64) load.Result {
		body := fmt.Appendf(nil, `{"email":%q,"name":"Bench Person %d","status":%q}`, c.Email("c"), seq, status)
		return result(c.do(ctx, http.MethodPost, subscribersPath, body, false), 1)
	}
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

// BulkOp creates 100 subscribers with one bulk request.
func (c *Client) BulkOp() load.Op {
	return func(ctx context.Context, _ int, _ int64) load.Result {
		return result(c.do(ctx, http.MethodPost, bulkPath, c.bulkBody("b", BulkSize), false), BulkSize)
	}
}

// Probe runs sc once, reading the whole response, and validates it with sc.Check.
func (c *Client) Probe(ctx context.Context, sc Scenario) error {
	var status int
	var body []byte
	var err error
	switch sc.Name {
	case ListFirst:
		status, body, err = c.probe(ctx, http.MethodGet, listPath(1, ""), nil)
	case ListDeep:
		status, body, err = c.probe(ctx, http.MethodGet, listPath(DeepPage, ""), nil)
	case ListStatus:
		status, body, err = c.probe(ctx, http.MethodGet, listPath(1, StatusFiltered), nil)
	case Get:
		status, body, err = c.probe(ctx, http.MethodGet, subscribersPath+"/"+c.pickID(), nil)
	case Update:
		status, body, err = c.probe(ctx, http.MethodPut, subscribersPath+"/"+c.pickID(), []byte(`{"name":"Probe Update"}`))
	case CreateActive, CreatePending:
		st := "active"
		if sc.Name == CreatePending {
			st = "pending"
		}
		status, body, err = c.probe(ctx, http.MethodPost, subscribersPath,
			fmt.Appendf(nil, `{"email":%q,"name":"Probe Person","status":%q}`, c.Email("p"), st))
	case Bulk100:
		status, body, err = c.probe(ctx, http.MethodPost, bulkPath, c.bulkBody("p", BulkSize))
	case CreateIdem, Replay, LookupEmail, ListCursorDeep:
		status, body, err = c.probe11(ctx, sc.Name)
	default:
		return fmt.Errorf("no probe for scenario %q", sc.Name)
	}
	if err != nil {
		return err
	}
	return sc.Check(status, body)
}

func (c *Client) probe(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	r := c.do(ctx, method, path, body, true)
	return r.status, r.body, r.err
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

func (s Subscriber) check() error {
	if s.ID == "" || s.Email == "" || s.Status == "" || s.CreatedAt == "" {
		return fmt.Errorf("subscriber lacks id, email, status or created_at: %+v", s)
	}
	return nil
}

func checkOne(want int) func(int, []byte) error {
	return func(status int, body []byte) error {
		env, err := decode(status, want, body)
		if err != nil {
			return err
		}
		var s Subscriber
		if err := json.Unmarshal(env.Data, &s); err != nil {
			return fmt.Errorf("data is not a subscriber: %v", err)
		}
		return s.check()
	}
}

// checkList validates a list page; full asks for a full page of PageSize.
func checkList(status int, body []byte, full bool) error {
	env, err := decode(status, 200, body)
	if err != nil {
		return err
	}
	var subs []Subscriber
	if err := json.Unmarshal(env.Data, &subs); err != nil {
		return fmt.Errorf("data is not a list of subscribers: %v", err)
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
	env, err := decode(status, 201, body)
	if err != nil {
		return nil, err
	}
	var data struct {
		Created []Subscriber `json:"created"`
	}
	if err := json.Unmarshal(env.Data, &data); err != nil {
		return nil, fmt.Errorf("data is not {created: [...]}: %v", err)
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
	if parallel < 1 {
		parallel = 1
	}
	batches := (n + BulkSize - 1) / BulkSize
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var mu sync.Mutex
	ids := make([]string, 0, n)
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			for size := range next {
				r := c.do(ctx, http.MethodPost, bulkPath, c.bulkBody("seed", size), true)
				if r.err != nil {
					cancel(fmt.Errorf("seed bulk: %w", r.err))
					return
				}
				got, err := bulkCreated(r.status, r.body, size)
				if err != nil {
					cancel(fmt.Errorf("seed bulk: %w", err))
					return
				}
				mu.Lock()
				ids = append(ids, got...)
				done := len(ids)
				mu.Unlock()
				if progress != nil {
					progress(done)
				}
			}
		})
	}
feed:
	for b := range batches {
		size := min(BulkSize, n-b*BulkSize)
		select {
		case next <- size:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return ids, err
	}
	return ids, nil
}

// ListIDs returns up to n subscriber ids of the newsletter, newest first, read with the list
// operation (for runs on a newsletter seeded earlier).
func (c *Client) ListIDs(ctx context.Context, n int) ([]string, error) {
	var ids []string
	for page := 1; len(ids) < n; page++ {
		r := c.do(ctx, http.MethodGet, fmt.Sprintf("%s?page=%d&limit=100", subscribersPath, page), nil, true)
		if r.err != nil {
			return ids, r.err
		}
		env, err := decode(r.status, 200, r.body)
		if err != nil {
			return ids, err
		}
		var subs []Subscriber
		if err := json.Unmarshal(env.Data, &subs); err != nil {
			return ids, err
		}
		if len(subs) == 0 {
			break
		}
		for _, s := range subs {
			ids = append(ids, s.ID)
		}
	}
	if len(ids) > n {
		ids = ids[:n]
	}
	return ids, nil
}

// Total returns the newsletter's subscriber total as the list operation reports it.
func (c *Client) Total(ctx context.Context) (int64, error) {
	r := c.do(ctx, http.MethodGet, subscribersPath+"?page=1&limit=1", nil, true)
	if r.err != nil {
		return 0, r.err
	}
	env, err := decode(r.status, 200, r.body)
	if err != nil {
		return 0, err
	}
	if env.Pagination == nil {
		return 0, errors.New("list without pagination")
	}
	return env.Pagination.Total, nil
}

// CreateWebhook makes a webhook endpoint for url subscribed to every event type and returns
// its id.
func (c *Client) CreateWebhook(ctx context.Context, url string) (string, error) {
	body, _ := json.Marshal(map[string]string{"url": url})
	r := c.do(ctx, http.MethodPost, "/api/v1/webhooks", body, true)
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
	r := c.do(ctx, http.MethodDelete, "/api/v1/webhooks/"+id, nil, false)
	if r.err != nil {
		return r.err
	}
	if r.status != http.StatusOK {
		return fmt.Errorf("DELETE /webhooks/%s: %d", id, r.status)
	}
	return nil
}
