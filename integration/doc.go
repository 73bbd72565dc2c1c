// Package integration holds subscriberd's black-box tests: the real object graph, built from
// the constructors cmd/subscriberd uses, served over real HTTP against a real PostgreSQL.
//
// The database comes from internal/testdb: TEST_DATABASE_URL when set, otherwise a PostgreSQL
// container from POSTGRES_IMAGE. With neither, the tests fail: they never pass by skipping.
// Each test gets a fresh database cloned from a migrated template.
package integration
