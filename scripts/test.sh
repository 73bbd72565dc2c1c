#!/usr/bin/env bash
# Runs every test of subscriberd: vet, staticcheck, `go test -race ./...` (unit, fuzz seed
# corpora and integration tests against a real PostgreSQL and Redis) and the Prometheus alert
# rules' checks and unit tests (promtool).
#
# Integration tests start PostgreSQL and Redis containers with testcontainers when a Docker
# engine answers. Without one, they use the machine's own servers through TEST_DATABASE_URL and
# TEST_REDIS_URL (defaults below); set those yourself to point the tests anywhere else.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${TEST_DATABASE_URL:-}" ] && ! docker info >/dev/null 2>&1; then
  export TEST_DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
  export TEST_REDIS_URL="${TEST_REDIS_URL:-redis://127.0.0.1:6379/0}"
  echo "############################################################################" >&2
  echo "## NO DOCKER ENGINE: integration tests use the machine's PostgreSQL and   ##" >&2
  echo "## Redis instead of containers:                                           ##" >&2
  echo "##   TEST_DATABASE_URL=$TEST_DATABASE_URL" >&2
  echo "##   TEST_REDIS_URL=$TEST_REDIS_URL" >&2
  echo "############################################################################" >&2
fi

echo "== go vet" >&2
go vet ./...
echo "== staticcheck" >&2
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
echo "== go test -race" >&2
go test -race -count=1 -timeout 30m ./...
echo "== promtool check rules / test rules" >&2
./scripts/promtool.sh
