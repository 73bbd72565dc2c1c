// Package integration holds subscriberd's black-box tests: the real object graph, built from
// the constructors cmd/subscriberd uses, served over real HTTP against a real PostgreSQL.
//
// The database is TEST_DATABASE_URL when set (any database on a server where the user may
// create databases); otherwise a PostgreSQL container started with testcontainers from
// POSTGRES_IMAGE (default postgres:15). With neither, the tests fail: they never pass by
// skipping. Each test gets a fresh database cloned from a migrated template.
package integration
