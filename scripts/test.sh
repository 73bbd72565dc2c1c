#!/usr/bin/env bash
# Runs every test of subscriberd: vet, staticcheck, `go test -race ./...` (unit, fuzz seed
# corpora and integration tests against a real PostgreSQL and Redis), the integration and
# command tests a second time on the embedded SQLite store (TEST_STORE=sqlite), and the
# Prometheus alert rules' checks and unit tests (promtool).
#
# The docs page's browser test (api.TestDocsPageRendersOffline) needs headless Chromium; it is
# installed here with apt-get when missing, and the test is skipped, loudly, where it cannot be.
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

if [ -z "${CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  echo "== installing chromium (Debian package) for the docs page's browser test" >&2
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo -n"
  if ! { $sudo apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 ||
         { $sudo apt-get update >/dev/null 2>&1 && $sudo apt-get install -y --no-install-recommends chromium >/dev/null 2>&1; }; }; then
    echo "############################################################################" >&2
    echo "## NO CHROMIUM: could not install it; the docs page browser test is      ##" >&2
    echo "## SKIPPED (api.TestDocsPageRendersOffline). Install the chromium package ##" >&2
    echo "## or set CHROMIUM=/path/to/chromium to run it.                           ##" >&2
    echo "############################################################################" >&2
  fi
fi

echo "== go vet" >&2
go vet ./...
echo "== staticcheck" >&2
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
echo "== go test -race ./... (store: postgres)" >&2
TEST_STORE=postgres go test -race -count=1 -timeout 30m ./...
# The same integration suite and command tests again on the embedded SQLite store: a matrix,
# not a copy. The bench packages stay on PostgreSQL, the store every performance figure is about.
echo "== go test -race ./integration ./cmd/subscriberd (store: sqlite)" >&2
TEST_STORE=sqlite go test -race -count=1 -timeout 30m ./integration ./cmd/subscriberd
echo "== promtool check rules / test rules" >&2
./scripts/promtool.sh
