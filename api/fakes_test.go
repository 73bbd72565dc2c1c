package api_test

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/api"
	"github.com/subscriberd/subscriberd/model"
)

// Fixed values the fakes hand out, so that bodies and golden files are stable.
var (
	newsletterA = uuid.MustParse("01900000-0000-7000-8000-00000000000a")
	newsletterB = uuid.MustParse("01900000-0000-7000-8000-00000000000b")
	keyA        = "sk_" + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA" // newsletter A, API access
	keyB        = "sk_" + "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB" // newsletter B, API access
	keyNoAccess = "sk_" + "CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC" // a plan without API access
	keyUnknown  = "sk_" + "DDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDD" // well formed, never issued
	// createdAt is 17:00 UTC given in another zone and with a fraction, which the API must drop.
	createdAt = time.Date(2026, 6, 11, 19, 0, 0, 123456789, time.FixedZone("CEST", 2*3600))
)

// fakeStore is an in-memory api.Store that follows the storage contract: newsletters are
// isolated, emails unique per newsletter case-insensitively, ids time-ordered.
type fakeStore struct {
	mu    sync.Mutex
	subs  []model.Subscriber // in creation order
	seq   int
	calls []string
	// received is every NewSubscriber passed to Create or CreateMany.
	received []model.NewSubscriber

	// err, when set, is returned by every method; panicWith makes every method panic.
	err       error
	panicWith any
}

var _ api.Store = (*fakeStore)(nil)

func (s *fakeStore) enter(op string) error {
	s.calls = append(s.calls, op)
	if s.panicWith != nil {
		panic(s.panicWith)
	}
	return s.err
}

// Calls returns the store methods called so far.
func (s *fakeStore) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// created returns what Create and CreateMany received.
func (s *fakeStore) created() []model.NewSubscriber {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.received)
}

// add stores an active subscriber directly, bypassing the API.
func (s *fakeStore) add(newsletter uuid.UUID) model.Subscriber {
	s.mu.Lock()
	defer s.mu.Unlock()
	sub := s.newSub(newsletter, model.NewSubscriber{Email: fmt.Sprintf("added%d@example.com", s.seq+1), Status: model.StatusActive})
	s.subs = append(s.subs, sub)
	return sub
}

func (s *fakeStore) nextID() uuid.UUID {
	s.seq++
	return uuid.MustParse(fmt.Sprintf("01900000-0000-7000-8000-%012d", s.seq))
}

func (s *fakeStore) taken(newsletter uuid.UUID, email string, except uuid.UUID) bool {
	for _, sub := range s.subs {
		if sub.NewsletterID == newsletter && sub.ID != except && model.EmailKey(sub.Email) == model.EmailKey(email) {
			return true
		}
	}
	return false
}

func (s *fakeStore) newSub(newsletter uuid.UUID, in model.NewSubscriber) model.Subscriber {
	return model.Subscriber{
		ID: s.nextID(), NewsletterID: newsletter, Email: in.Email,
		FirstName: in.FirstName, LastName: in.LastName, Status: in.Status,
		CreatedAt: createdAt, UpdatedAt: createdAt,
	}
}

func (s *fakeStore) Create(_ context.Context, newsletter uuid.UUID, in model.NewSubscriber) (model.Subscriber, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("Create"); err != nil {
		return model.Subscriber{}, err
	}
	s.received = append(s.received, in)
	if s.taken(newsletter, in.Email, uuid.Nil) {
		return model.Subscriber{}, fmt.Errorf("fake insert: %w", model.ErrEmailTaken)
	}
	sub := s.newSub(newsletter, in)
	s.subs = append(s.subs, sub)
	return sub, nil
}

func (s *fakeStore) CreateMany(_ context.Context, newsletter uuid.UUID, in []model.NewSubscriber) ([]model.Subscriber, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("CreateMany"); err != nil {
		return nil, err
	}
	s.received = append(s.received, in...)
	var taken []int
	for i, ns := range in {
		if s.taken(newsletter, ns.Email, uuid.Nil) {
			taken = append(taken, i)
		}
	}
	if taken != nil {
		return nil, fmt.Errorf("fake insert: %w", &model.EmailTakenError{Indexes: taken})
	}
	out := make([]model.Subscriber, len(in))
	for i, ns := range in {
		out[i] = s.newSub(newsletter, ns)
	}
	s.subs = append(s.subs, out...)
	return out, nil
}

func (s *fakeStore) TakenEmails(_ context.Context, newsletter uuid.UUID, emails []string) (map[string]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("TakenEmails"); err != nil {
		return nil, err
	}
	taken := map[string]bool{}
	for _, e := range emails {
		if s.taken(newsletter, e, uuid.Nil) {
			taken[model.EmailKey(e)] = true
		}
	}
	return taken, nil
}

func (s *fakeStore) List(_ context.Context, newsletter uuid.UUID, q model.ListQuery) ([]model.Subscriber, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("List"); err != nil {
		return nil, 0, err
	}
	var match []model.Subscriber
	for _, sub := range s.subs {
		if sub.NewsletterID == newsletter && (q.Status == "" || sub.Status == q.Status) &&
			(q.Email == "" || model.EmailKey(sub.Email) == model.EmailKey(q.Email)) {
			match = append(match, sub)
		}
	}
	slices.SortFunc(match, func(a, b model.Subscriber) int { // newest first
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), slices.Compare(b.ID[:], a.ID[:]))
	})
	total := int64(len(match))
	lo := min(q.Offset(), len(match))
	if q.After != nil {
		lo = len(match)
		for i, sub := range match {
			if model.Follows(q.After, sub) {
				lo = i
				break
			}
		}
	}
	hi := min(lo+q.Limit+1, len(match)) // one more than the page, as repo does
	return match[lo:hi], total, nil
}

func (s *fakeStore) find(newsletter, id uuid.UUID) int {
	return slices.IndexFunc(s.subs, func(sub model.Subscriber) bool {
		return sub.ID == id && sub.NewsletterID == newsletter
	})
}

func (s *fakeStore) Get(_ context.Context, newsletter, id uuid.UUID) (model.Subscriber, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("Get"); err != nil {
		return model.Subscriber{}, err
	}
	i := s.find(newsletter, id)
	if i < 0 {
		return model.Subscriber{}, fmt.Errorf("fake get %s: %w", id, model.ErrNotFound)
	}
	return s.subs[i], nil
}

func (s *fakeStore) Update(_ context.Context, newsletter, id uuid.UUID, p model.SubscriberPatch) (model.Subscriber, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("Update"); err != nil {
		return model.Subscriber{}, err
	}
	i := s.find(newsletter, id)
	if i < 0 {
		return model.Subscriber{}, fmt.Errorf("fake update %s: %w", id, model.ErrNotFound)
	}
	sub := s.subs[i]
	if p.Email != nil {
		if s.taken(newsletter, *p.Email, id) {
			return model.Subscriber{}, fmt.Errorf("fake update: %w", model.ErrEmailTaken)
		}
		sub.Email = *p.Email
	}
	if p.Name != nil {
		sub.FirstName, sub.LastName = model.SplitName(*p.Name)
	}
	if p.Status != nil {
		sub.Status = *p.Status
	}
	s.subs[i] = sub
	return sub, nil
}

// Upsert creates the subscriber with in.Email or updates the one that has it, under the
// store's lock (the repo's unit of work).
func (s *fakeStore) Upsert(_ context.Context, newsletter uuid.UUID, in model.NewSubscriber, p model.SubscriberPatch) (model.Subscriber, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("Upsert"); err != nil {
		return model.Subscriber{}, false, err
	}
	i := slices.IndexFunc(s.subs, func(sub model.Subscriber) bool {
		return sub.NewsletterID == newsletter && model.EmailKey(sub.Email) == model.EmailKey(in.Email)
	})
	if i < 0 {
		s.received = append(s.received, in)
		sub := s.newSub(newsletter, in)
		s.subs = append(s.subs, sub)
		return sub, true, nil
	}
	sub := s.subs[i]
	if p.Name != nil {
		sub.FirstName, sub.LastName = model.SplitName(*p.Name)
	}
	if p.Status != nil {
		sub.Status = *p.Status
	}
	s.subs[i] = sub
	return sub, false, nil
}

func (s *fakeStore) Unsubscribe(_ context.Context, newsletter, id uuid.UUID) (model.Subscriber, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("Unsubscribe"); err != nil {
		return model.Subscriber{}, err
	}
	i := s.find(newsletter, id)
	if i < 0 {
		return model.Subscriber{}, fmt.Errorf("fake unsubscribe %s: %w", id, model.ErrNotFound)
	}
	s.subs[i].Status = model.StatusUnsubscribed
	return s.subs[i], nil
}

// fakeAuth is an api.Authenticator over a map of key hashes.
type fakeAuth struct {
	mu      sync.Mutex
	keys    map[[32]byte]model.Principal
	revoked map[[32]byte]model.Principal
	lookups int
	err     error // returned for every lookup when set
}

var _ api.Authenticator = (*fakeAuth)(nil)

func newFakeAuth() *fakeAuth {
	a := &fakeAuth{keys: map[[32]byte]model.Principal{}, revoked: map[[32]byte]model.Principal{}}
	a.Set(keyA, model.Principal{KeyID: uuid.New(), NewsletterID: newsletterA, APIAccess: true})
	a.Set(keyB, model.Principal{KeyID: uuid.New(), NewsletterID: newsletterB, APIAccess: true})
	a.Set(keyNoAccess, model.Principal{KeyID: uuid.New(), NewsletterID: newsletterA, APIAccess: false})
	return a
}

func (a *fakeAuth) Authenticate(_ context.Context, hash []byte) (model.Principal, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lookups++
	if a.err != nil {
		return model.Principal{}, a.err
	}
	if p, ok := a.revoked[[32]byte(hash)]; ok {
		return model.Principal{KeyID: p.KeyID, NewsletterID: p.NewsletterID}, fmt.Errorf("fake auth: %w", model.ErrKeyRevoked)
	}
	p, ok := a.keys[[32]byte(hash)]
	if !ok {
		return model.Principal{}, fmt.Errorf("fake auth: %w", model.ErrKeyNotFound)
	}
	return p, nil
}

// Set issues key with principal p (or changes what it grants).
func (a *fakeAuth) Set(key string, p model.Principal) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.keys[[32]byte(model.HashKey(key))] = p
	delete(a.revoked, [32]byte(model.HashKey(key)))
}

// Revoke revokes key, as the repo does: it is refused, and told apart from an unknown key.
func (a *fakeAuth) Revoke(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := [32]byte(model.HashKey(key))
	if p, ok := a.keys[h]; ok {
		a.revoked[h] = p
		delete(a.keys, h)
	}
}

// Lookups returns how many times the server asked for a key.
func (a *fakeAuth) Lookups() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lookups
}

// fakeMetrics records what the server reports.
type fakeMetrics struct {
	mu           sync.Mutex
	inFlight     int
	observed     []observation
	created      map[string]int // "operation/status" → n
	authFailures map[string]int
	idempotency  map[string]int // outcome → count
}

type observation struct {
	Method, Route string
	Code          int
}

var _ api.Metrics = (*fakeMetrics)(nil)

func (m *fakeMetrics) RequestStarted() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inFlight++
}

func (m *fakeMetrics) RequestDone() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inFlight--
}

func (m *fakeMetrics) ObserveRequest(_ context.Context, method, route string, code int, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.observed = append(m.observed, observation{method, route, code})
}

func (m *fakeMetrics) SubscribersCreated(operation, status string, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.created == nil {
		m.created = map[string]int{}
	}
	m.created[operation+"/"+status] += n
}

// reset forgets everything but the first keep subscribers, so long fuzz runs stay small.
func (s *fakeStore) reset(keep int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subs = s.subs[:min(keep, len(s.subs))]
	s.calls, s.received = nil, nil
}

func (m *fakeMetrics) AuthFailure(reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.authFailures == nil {
		m.authFailures = map[string]int{}
	}
	m.authFailures[reason]++
}

func (m *fakeMetrics) IdempotencyOutcome(outcome string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.idempotency == nil {
		m.idempotency = map[string]int{}
	}
	m.idempotency[outcome]++
}

// Idempotency returns the idempotency outcomes counted so far.
func (m *fakeMetrics) Idempotency() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.idempotency)
}

// The bulk gate's metrics are checked with gateMetrics (gate_test.go).
func (m *fakeMetrics) BulkGateWaiting(int)                {}
func (m *fakeMetrics) BulkGateWait(string, time.Duration) {}
func (m *fakeMetrics) ScopeRefused(string)                {}
func (m *fakeMetrics) SuppressionsCreated(string, int)    {}
func (m *fakeMetrics) PagePost(string, string)            {}

// The privacy metrics are checked against the real registry (integration.TestTracePrivacy).
func (m *fakeMetrics) PrivacyRequest(string, string) {}

// fakeIdempotency is an in-memory api.IdempotencyStore: a request in progress is a set entry,
// a stored response a map entry (no transactions: the fakes' changes are not rolled back).
type fakeIdempotency struct {
	mu      sync.Mutex
	stored  map[string]model.StoredResponse
	running map[string]bool
	stores  api.Stores // handed to every request, as a unit of work hands out its own
	// blind makes Lookup find nothing: a request with the key then meets the stored response
	// only in Run, as one does whose twin finished between the look-up and Run's lock.
	blind bool
}

func newFakeIdempotency() *fakeIdempotency {
	return &fakeIdempotency{stored: map[string]model.StoredResponse{}, running: map[string]bool{}}
}

func (f *fakeIdempotency) Lookup(_ context.Context, nl uuid.UUID, key string) (model.StoredResponse, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.stored[nl.String()+" "+key]
	return r, ok && !f.blind, nil
}

func (f *fakeIdempotency) Run(ctx context.Context, nl uuid.UUID, key string, fp []byte,
	fn func(st api.Stores) (*model.StoredResponse, error)) (model.IdempotencyResult, error) {
	k := nl.String() + " " + key
	f.mu.Lock()
	if f.running[k] {
		f.mu.Unlock()
		return model.IdempotencyResult{}, model.ErrIdempotencyInUse
	}
	if r, ok := f.stored[k]; ok {
		f.mu.Unlock()
		return model.IdempotencyResult{Stored: &r}, nil
	}
	f.running[k] = true
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.running, k)
		f.mu.Unlock()
	}()
	resp, err := fn(f.stores)
	if err != nil {
		return model.IdempotencyResult{}, err
	}
	if resp != nil {
		f.mu.Lock()
		f.stored[k] = *resp
		f.mu.Unlock()
	}
	return model.IdempotencyResult{Ran: true}, nil
}
