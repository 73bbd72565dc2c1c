package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/model"
)

// The edge's own cost per request, storage excluded: routing, authentication (cached and
// not), body preflight and decoding, validation, and envelope encoding. The store and the
// key lookup are in-memory stand-ins that answer at once.
// Run with: go test -run '^$' -bench . -benchmem ./api

type benchStore struct{ sub model.Subscriber }

func (s benchStore) Create(_ context.Context, _ uuid.UUID, in model.NewSubscriber) (model.Subscriber, error) {
	out := s.sub
	out.Email, out.FirstName, out.LastName, out.Status = in.Email, in.FirstName, in.LastName, in.Status
	return out, nil
}

func (s benchStore) CreateMany(_ context.Context, _ uuid.UUID, in []model.NewSubscriber) ([]model.Subscriber, error) {
	out := make([]model.Subscriber, len(in))
	for i, x := range in {
		out[i] = s.sub
		out[i].Email, out[i].FirstName, out[i].LastName, out[i].Status = x.Email, x.FirstName, x.LastName, x.Status
	}
	return out, nil
}

func (s benchStore) TakenEmails(context.Context, uuid.UUID, []string) (map[string]bool, error) {
	return nil, nil
}

func (s benchStore) List(_ context.Context, _ uuid.UUID, q model.ListQuery) ([]model.Subscriber, int64, error) {
	out := make([]model.Subscriber, q.Limit)
	for i := range out {
		out[i] = s.sub
	}
	return out, 100000, nil
}

func (s benchStore) Get(context.Context, uuid.UUID, uuid.UUID) (model.Subscriber, error) {
	return s.sub, nil
}

func (s benchStore) Upsert(context.Context, uuid.UUID, model.NewSubscriber, model.SubscriberPatch) (model.Subscriber, bool, error) {
	return s.sub, false, nil
}

func (s benchStore) Update(context.Context, uuid.UUID, uuid.UUID, model.SubscriberPatch) (model.Subscriber, error) {
	return s.sub, nil
}

func (s benchStore) Unsubscribe(context.Context, uuid.UUID, uuid.UUID) (model.Subscriber, error) {
	return s.sub, nil
}

type benchAuth struct{ p model.Principal }

func (a benchAuth) Authenticate(context.Context, []byte) (model.Principal, error) { return a.p, nil }

func benchServer(b *testing.B, cacheTTL time.Duration) (*Server, string) {
	b.Helper()
	key, _, _ := model.NewKeySecret()
	nl := uuid.Must(uuid.NewV7())
	now := time.Now().UTC()
	sub := model.Subscriber{ID: uuid.Must(uuid.NewV7()), NewsletterID: nl, Email: "ada@example.com",
		FirstName: "Ada", LastName: "Lovelace", Status: model.StatusActive, CreatedAt: now, UpdatedAt: now}
	s := New(Config{
		Store:       benchStore{sub: sub},
		Auth:        benchAuth{p: model.Principal{KeyID: uuid.Must(uuid.NewV7()), NewsletterID: nl, APIAccess: true}},
		Logger:      slog.New(slog.DiscardHandler),
		KeyCacheTTL: cacheTTL,
	})
	return s, key
}

// serveBench sends the same request b.N times through the whole handler.
func serveBench(b *testing.B, s *Server, key, method, target string, body []byte, want int) {
	b.Helper()
	b.ReportAllocs()
	if body != nil {
		b.SetBytes(int64(len(body)))
	}
	for b.Loop() {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req := httptest.NewRequest(method, target, rd)
		req.Header.Set("Authorization", "Bearer "+key)
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != want {
			b.Fatalf("%s %s: status %d, want %d: %s", method, target, rec.Code, want, rec.Body.String())
		}
	}
}

func BenchmarkServeCreate(b *testing.B) {
	s, key := benchServer(b, 0)
	body := []byte(`{"email":"Person.1@Example.com","name":"Ada Lovelace King","status":"pending"}`)
	serveBench(b, s, key, http.MethodPost, BasePath+"/subscribers", body, http.StatusCreated)
}

func BenchmarkServeCreateInvalid(b *testing.B) {
	s, key := benchServer(b, 0)
	body := []byte(`{"email":"nope","name":5,"status":"gone","extra":1}`)
	serveBench(b, s, key, http.MethodPost, BasePath+"/subscribers", body, http.StatusUnprocessableEntity)
}

func BenchmarkServeBulk100(b *testing.B) {
	s, key := benchServer(b, 0)
	var items []string
	for i := range 100 {
		items = append(items, fmt.Sprintf(`{"email":"person.%d@example.com","name":"Person %d","status":"active"}`, i, i))
	}
	body := []byte("[" + strings.Join(items, ",") + "]")
	serveBench(b, s, key, http.MethodPost, BasePath+"/subscribers/bulk", body, http.StatusCreated)
}

func BenchmarkServeList25(b *testing.B) {
	s, key := benchServer(b, 0)
	serveBench(b, s, key, http.MethodGet, BasePath+"/subscribers?page=2000&limit=25&status=active", nil, http.StatusOK)
}

func BenchmarkServeGet(b *testing.B) {
	s, key := benchServer(b, 0)
	serveBench(b, s, key, http.MethodGet, BasePath+"/subscribers/"+uuid.Must(uuid.NewV7()).String(), nil, http.StatusOK)
}

func BenchmarkServeUpdate(b *testing.B) {
	s, key := benchServer(b, 0)
	serveBench(b, s, key, http.MethodPut, BasePath+"/subscribers/"+uuid.Must(uuid.NewV7()).String(),
		[]byte(`{"name":"Grace Hopper"}`), http.StatusOK)
}

// BenchmarkServeGetUncachedKey is BenchmarkServeGet with the key cache off: every request
// hashes the key and asks the Authenticator (here in memory; the database lookup itself is
// what the load tool's get scenario adds).
func BenchmarkServeGetUncachedKey(b *testing.B) {
	s, key := benchServer(b, -1)
	serveBench(b, s, key, http.MethodGet, BasePath+"/subscribers/"+uuid.Must(uuid.NewV7()).String(), nil, http.StatusOK)
}

// BenchmarkKeyVerification is the key check alone: parse the header, check the key's shape,
// hash it, then the cache (or, uncached, the Authenticator).
func BenchmarkKeyVerification(b *testing.B) {
	for _, tc := range []struct {
		name string
		ttl  time.Duration
	}{{"cached", 0}, {"uncached", -1}} {
		b.Run(tc.name, func(b *testing.B) {
			s, key := benchServer(b, tc.ttl)
			header := "Bearer " + key
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := s.principal(ctx, header); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEnvelopeList25 encodes a full list page the way Huma's JSON format does.
func BenchmarkEnvelopeList25(b *testing.B) {
	now := time.Now().UTC()
	data := make([]Subscriber, 25)
	for i := range data {
		data[i] = toSubscriber(model.Subscriber{ID: uuid.Must(uuid.NewV7()), Email: fmt.Sprintf("p%d@example.com", i),
			FirstName: "Ada", LastName: "Lovelace", Status: model.StatusActive, CreatedAt: now})
	}
	env := ListEnvelope{Success: true, Data: data, Pagination: Pagination{Page: ptr(1), Limit: 25, Total: 100000, Pages: ptr(int64(4000))}}
	var buf bytes.Buffer
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		if err := json.NewEncoder(&buf).Encode(env); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(buf.Len()))
}

// BenchmarkErrorEnvelope encodes a 422 with field errors, the most common error answer.
func BenchmarkErrorEnvelope(b *testing.B) {
	var v *model.ValidationError
	v = v.Add("email", "The email field must be a valid email address.").Add("name", "The name field must be a string.")
	e := validationError(v)
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		writeError(rec, e)
	}
}
