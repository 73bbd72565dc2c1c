#!/usr/bin/env bash
# Runs every test of subscriberd: vet, staticcheck, `go test -race ./...` (unit, fuzz seed
# corpora and integration tests against a real PostgreSQL and Redis), the integration and
# command tests a second time on the embedded SQLite store (TEST_STORE=sqlite), and the
# Prometheus alert rules' checks and unit tests (promtool), and the compile check of the
# TypeScript client generated from the OpenAPI document (scripts/tsclient.sh; skipped, loudly,
# without node or when npm cannot install its pinned packages).
#
# The docs page's browser test (api.TestDocsPageRendersOffline) needs headless Chromium; it is
# installed here with apt-get when missing, and the test is skipped, loudly, where it cannot be.
#
# Integration tests start PostgreSQL and Redis containers with testcontainers when a Docker
# engine answers and has the images (POSTGRES_IMAGE, default postgres:15; REDIS_IMAGE, default
# redis:7) or can pull them. Without an engine, or when it cannot pull a missing image (an
# offline machine, a registry outage), they use the machine's own servers through
# TEST_DATABASE_URL and TEST_REDIS_URL (defaults below), saying so; if those do not answer
# either, the script stops at once and says what to set. Set the variables yourself to point
# the tests anywhere else.
set -euo pipefail
cd "$(dirname "$0")/.."

# The machine's own servers, the fallback (MACHINE_DATABASE_URL and MACHINE_REDIS_URL name
# others).
local_db="${MACHINE_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}"
local_redis="${MACHINE_REDIS_URL:-redis://127.0.0.1:6379/0}"
local_db_addr=$(echo "$local_db" | sed -E 's|^[a-z]+://([^@/]*@)?([^/?]+).*|\2|')

# answers HOST PORT: whether something accepts TCP connections there.
answers() { timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }

# use_machine_services WHY: point the integration tests at the machine's PostgreSQL and Redis,
# loudly, or stop with one line when they do not answer.
use_machine_services() {
  if ! answers "${local_db_addr%:*}" "${local_db_addr##*:}"; then
    echo "scripts/test.sh: $1, and no PostgreSQL answers on $local_db_addr: set TEST_DATABASE_URL and TEST_REDIS_URL, or POSTGRES_IMAGE and REDIS_IMAGE to images Docker has." >&2
    exit 2
  fi
  export TEST_DATABASE_URL="$local_db"
  export TEST_REDIS_URL="${TEST_REDIS_URL:-$local_redis}"
  echo "############################################################################" >&2
  echo "## $1" >&2
  echo "## Integration tests use the machine's PostgreSQL and Redis instead of     ##" >&2
  echo "## containers:                                                            ##" >&2
  echo "##   TEST_DATABASE_URL=$TEST_DATABASE_URL" >&2
  echo "##   TEST_REDIS_URL=$TEST_REDIS_URL" >&2
  echo "############################################################################" >&2
}

if [ -z "${TEST_DATABASE_URL:-}" ]; then
  if ! docker info >/dev/null 2>&1; then
    use_machine_services "NO DOCKER ENGINE"
  else
    # testcontainers would pull a missing image itself and fail six packages with a registry
    # error; find out once, here.
    missing=""
    images="${POSTGRES_IMAGE:-postgres:15}"
    [ -z "${TEST_REDIS_URL:-}" ] && images="$images ${REDIS_IMAGE:-redis:7}"
    for img in $images; do
      docker image inspect "$img" >/dev/null 2>&1 && continue
      echo "== pulling $img for the integration tests' containers" >&2
      timeout 300 docker pull "$img" >/dev/null 2>&1 || missing="$missing $img"
    done
    if [ -n "$missing" ]; then
      use_machine_services "DOCKER CANNOT PULL$missing (offline, or the registry is down)"
    fi
  fi
fi

# TEST_SH_ENV_ONLY=1 stops here and prints what the tests would use (scripts/test_sh_test.go).
if [ "${TEST_SH_ENV_ONLY:-}" = 1 ]; then
  echo "TEST_DATABASE_URL=${TEST_DATABASE_URL:-}"
  echo "TEST_REDIS_URL=${TEST_REDIS_URL:-}"
  exit 0
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

# The alerts' live test (integration.TestAlertsFireInLivePrometheus) runs a real Prometheus
# server; it is skipped, loudly, where none is installed.
if [ -z "${PROMETHEUS:-}" ] && ! command -v prometheus >/dev/null 2>&1; then
  echo "== installing prometheus (Debian package) for the alerts' live test" >&2
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo -n"
  if ! { $sudo apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1 ||
         { $sudo apt-get update >/dev/null 2>&1 && $sudo apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1; }; }; then
    echo "############################################################################" >&2
    echo "## NO PROMETHEUS: could not install it; the alerts' live test is SKIPPED  ##" >&2
    echo "## (integration.TestAlertsFireInLivePrometheus). Install the prometheus   ##" >&2
    echo "## package or set PROMETHEUS=/path/to/prometheus to run it.              ##" >&2
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
# Fuzzing, bounded in time: one target per invocation (go test -fuzz takes one package and no
# -race). The address rule of docs/api-contract.md §18: validator, key and SMTP envelope agree.
echo "== go test -fuzz FuzzEmailAddress (20s)" >&2
go test -run '^$' -fuzz '^FuzzEmailAddress$' -fuzztime 20s ./model
echo "== promtool check rules / test rules" >&2
./scripts/promtool.sh
echo "== the generated TypeScript client compiles (openapi-typescript, tsc --strict)" >&2
./scripts/tsclient.sh
