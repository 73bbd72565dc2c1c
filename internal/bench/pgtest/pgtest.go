// Package pgtest gives tests a scratch PostgreSQL database with the project's migrations
// applied. It connects to TEST_DATABASE_URL when set, else to the machine's server at
// 127.0.0.1:5432 as user postgres, creates a database of its own there and drops it when the
// test ends. A database that cannot be reached fails the test: it is never skipped silently.
package pgtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/driver/pgdriver"
	"github.com/uptrace/bun/migrate"

	"github.com/subscriberd/subscriberd/migrations"
)

// DefaultAdminURL is the server used when TEST_DATABASE_URL is not set.
const DefaultAdminURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// AdminURL is the URL of the server the scratch databases are made on.
func AdminURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultAdminURL
}

func open(dsn string) *bun.DB {
	sqldb := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(dsn)))
	return bun.NewDB(sqldb, pgdialect.New())
}

// NewDatabase creates a migrated scratch database and returns its URL. It is dropped (with
// FORCE) when t ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	admin := AdminURL()
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("TEST_DATABASE_URL %q: %v", admin, err)
	}
	adb := open(admin)
	defer adb.Close()
	if err := adb.PingContext(ctx); err != nil {
		t.Fatalf("no PostgreSQL at %s (set TEST_DATABASE_URL to a server the tests may create databases on): %v",
			u.Redacted(), err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "bench_test_" + hex.EncodeToString(b[:])
	if _, err := adb.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create scratch database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		adb := open(admin)
		defer adb.Close()
		if _, err := adb.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop scratch database %s: %v", name, err)
		}
	})

	u.Path = "/" + name
	dsn := u.String()
	db := open(dsn)
	defer db.Close()
	ms, err := migrations.Postgres()
	if err != nil {
		t.Fatalf("load migrations: %v", err)
	}
	m := migrate.NewMigrator(db, ms)
	if err := m.Init(ctx); err != nil {
		t.Fatalf("migrate init: %v", err)
	}
	if _, err := m.Migrate(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return dsn
}

// Exec runs statements on dsn, failing t on the first error.
func Exec(t testing.TB, dsn string, query string, args ...any) {
	t.Helper()
	db := open(dsn)
	defer db.Close()
	if _, err := db.ExecContext(context.Background(), query, args...); err != nil {
		t.Fatalf("%s: %v", query, fmt.Sprint(err))
	}
}
