// Package testdb gives tests a real database of the store TEST_STORE names: "postgres" (the
// default) or "sqlite".
//
// PostgreSQL is TEST_DATABASE_URL when set, otherwise a container started with testcontainers
// from POSTGRES_IMAGE (default postgres:15). Each test gets a fresh database cloned from a
// migrated template. Without either source, Start fails: tests never pass by skipping.
//
// SQLite needs nothing: each test gets a fresh file in its own temporary directory, copied from
// a migrated template file.
package testdb

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/subscriberd/subscriberd/repo"
)

// The stores TEST_STORE selects.
const (
	Postgres = "postgres"
	SQLite   = "sqlite"
)

// Store is the store the tests run against: TEST_STORE, "postgres" when unset.
func Store() string {
	if s := os.Getenv("TEST_STORE"); s != "" {
		return s
	}
	return Postgres
}

// Server is a PostgreSQL server with a migrated template database, or, for SQLite, a
// directory with a migrated template file.
type Server struct {
	files    bool   // SQLite files, not a PostgreSQL server
	dsn      string // any database on the server, for creating and dropping others
	template string // the template database's name, or the template file's path on SQLite
	stop     func()
	mu       sync.Mutex
	n        atomic.Int64
}

// Start finds or starts the server and migrates the template. Call Close when done.
func Start(ctx context.Context) (*Server, error) {
	switch Store() {
	case Postgres:
	case SQLite:
		return startSQLite(ctx)
	default:
		return nil, fmt.Errorf("TEST_STORE=%q: want %s or %s", Store(), Postgres, SQLite)
	}
	s := &Server{dsn: os.Getenv("TEST_DATABASE_URL"), stop: func() {}}
	if s.dsn == "" {
		img := os.Getenv("POSTGRES_IMAGE")
		if img == "" {
			img = "postgres:15"
		}
		ctr, err := tcpostgres.Run(ctx, img,
			tcpostgres.WithDatabase("subscriberd"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
			// initdb takes its encoding from the locale: make the cluster UTF-8 whatever the
			// image's default (pgdriver refuses other encodings).
			testcontainers.WithEnv(map[string]string{"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}),
			// The integration package runs its tests in parallel, each with its own pools
			// (often two instances and a worker): the default 100 connections run out.
			testcontainers.WithCmdArgs("-c", "max_connections=400"),
			testcontainers.WithWaitStrategy(wait.ForAll(
				wait.ForLog("database system is ready to accept connections").WithOccurrence(2),
				wait.ForListeningPort("5432/tcp"),
			).WithDeadline(2*time.Minute)))
		if err != nil {
			return nil, fmt.Errorf("no PostgreSQL: set TEST_DATABASE_URL or make Docker available (POSTGRES_IMAGE=%s): %w", img, err)
		}
		s.stop = func() { testcontainers.TerminateContainer(ctr) } //nolint:errcheck // best effort at exit
		if s.dsn, err = ctr.ConnectionString(ctx, "sslmode=disable"); err != nil {
			s.stop()
			return nil, err
		}
		fmt.Fprintln(os.Stderr, "testdb: using a PostgreSQL container from", img)
	} else {
		fmt.Fprintln(os.Stderr, "testdb: using TEST_DATABASE_URL")
	}
	s.template = fmt.Sprintf("subscriberd_tmpl_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	if err := s.exec(ctx, `CREATE DATABASE "`+s.template+`" ENCODING 'UTF8' TEMPLATE template0`); err != nil {
		s.stop()
		return nil, fmt.Errorf("create template database: %w", err)
	}
	db, err := repo.Open(s.DSN(s.template), repo.Options{MaxConns: 2})
	if err == nil {
		_, err = repo.Migrate(ctx, db)
		db.Close()
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("migrate template database: %w", err)
	}
	return s, nil
}

// startSQLite migrates a template SQLite file in a temporary directory.
func startSQLite(ctx context.Context) (*Server, error) {
	dir, err := os.MkdirTemp("", "subscriberd-testdb-")
	if err != nil {
		return nil, err
	}
	s := &Server{files: true, template: filepath.Join(dir, "template.db"), stop: func() { os.RemoveAll(dir) }}
	db, err := repo.Open(repo.SQLiteURL(s.template), repo.Options{MaxConns: 1})
	if err == nil {
		_, err = repo.Migrate(ctx, db)
		// Closing the last connection checkpoints the WAL into the file and removes it, so the
		// file alone is the whole database.
		if cerr := db.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("migrate the SQLite template: %w", err)
	}
	if _, err := os.Stat(s.template + "-wal"); err == nil {
		s.stop()
		return nil, fmt.Errorf("the SQLite template kept its WAL file")
	}
	fmt.Fprintln(os.Stderr, "testdb: using SQLite files (TEST_STORE=sqlite)")
	return s, nil
}

// Close drops the template and stops the container, if any.
func (s *Server) Close() {
	if s.files {
		s.stop()
		return
	}
	s.exec(context.Background(), `DROP DATABASE IF EXISTS "`+s.template+`" WITH (FORCE)`) //nolint:errcheck
	s.stop()
}

// DSN is the server's URL pointed at database name (PostgreSQL only).
func (s *Server) DSN(name string) string {
	u, err := url.Parse(s.dsn)
	if err != nil {
		panic(err)
	}
	u.Path = "/" + name
	return u.String()
}

// Fresh clones the migrated template into a new database, dropped when t ends, and returns
// its URL.
func (s *Server) Fresh(t testing.TB) string {
	t.Helper()
	if s.files {
		b, err := os.ReadFile(s.template)
		if err != nil {
			t.Fatalf("read the SQLite template: %v", err)
		}
		path := filepath.Join(t.TempDir(), "subscribers.db")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatalf("create test database: %v", err)
		}
		return repo.SQLiteURL(path)
	}
	name := fmt.Sprintf("%s_%d", s.template, s.n.Add(1))
	s.mu.Lock() // CREATE DATABASE … TEMPLATE refuses while another clone reads the template
	err := s.exec(context.Background(), `CREATE DATABASE "`+name+`" TEMPLATE "`+s.template+`"`)
	s.mu.Unlock()
	if err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		s.exec(context.Background(), `DROP DATABASE IF EXISTS "`+name+`" WITH (FORCE)`) //nolint:errcheck
	})
	return s.DSN(name)
}

// Empty creates an empty database (no migrations), dropped when t ends.
func (s *Server) Empty(t testing.TB) string {
	t.Helper()
	if s.files { // in a directory that does not exist yet either
		return repo.SQLiteURL(filepath.Join(t.TempDir(), "data", "subscribers.db"))
	}
	name := fmt.Sprintf("%s_empty_%d", s.template, s.n.Add(1))
	t.Cleanup(func() {
		s.exec(context.Background(), `DROP DATABASE IF EXISTS "`+name+`" WITH (FORCE)`) //nolint:errcheck
	})
	return s.DSN(name)
}

func (s *Server) exec(ctx context.Context, query string) error {
	db, err := repo.Open(s.dsn, repo.Options{MaxConns: 1})
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, query)
	return err
}

// Main runs a test package's tests with a started server in *srv, and returns the exit code.
// Use it from TestMain: os.Exit(testdb.Main(m, &pg)).
func Main(m *testing.M, srv **Server) int {
	s, err := Start(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "testdb:", err)
		return 1
	}
	defer s.Close()
	*srv = s
	return m.Run()
}
