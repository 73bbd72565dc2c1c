// Package integration holds subscriberd's black-box tests: the real object graph, built from
// the constructors cmd/subscriberd uses, served over real HTTP against a real database.
//
// The database comes from internal/testdb, on the store TEST_STORE names. PostgreSQL (the
// default) is TEST_DATABASE_URL when set, otherwise a container from POSTGRES_IMAGE; with
// neither, the tests fail: they never pass by skipping. Each test gets a fresh database cloned
// from a migrated template. With TEST_STORE=sqlite each test gets a fresh SQLite file instead;
// the few tests that only mean something on PostgreSQL skip there, saying why (postgresOnly).
package integration
