#!/usr/bin/env bash
# Benchmark subscriberd end to end on this machine (issue 6): build the service and the load
# tool, start the service on a fresh database of the local PostgreSQL with every limit off,
# make a newsletter and an API key with the CLI, seed it through the bulk API, run every
# scenario and its raw-SQL baseline, print one table and write it as JSON.
#
#   scripts/bench.sh [--subscribers N] [--million] [--passes N] [--profile] [--keep-db]
#                    [--env NAME=VALUE]... [--markdown FILE] [--compare-with JSON] [-- tool flags]
#
#   --million         also seed up to 1M subscribers at the end and measure the first page again
#   --passes N        N passes of the measured run; the table shows medians (~2 min per pass)
#   --profile         CPU profiles and goroutine dumps from the admin listener into the output
#   --env NAME=VALUE  extra environment of the service (e.g. OTEL_SDK_DISABLED=true, LOG_LEVEL=info)
#   --markdown FILE   also write the results as Markdown (e.g. docs/benchmarks.md)
#   --compare-with J  set each measured scenario against an earlier run's bench.json
#
# Environment: PG_ADMIN_URL (default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable),
# BENCH_PORT / BENCH_ADMIN_PORT (default: free ports), BENCH_OUT (default bench-out/<time>).
set -euo pipefail

cd "$(dirname "$0")/.."
invocation="scripts/bench.sh${*:+ $*}"

subscribers=100000
million=0
profile=0
keep_db=0
passes=1
markdown=
compare=
service_env=()
extra=()
while [ $# -gt 0 ]; do
	case "$1" in
	--subscribers) subscribers="$2"; shift 2 ;;
	--million) million=1; shift ;;
	--profile) profile=1; shift ;;
	--keep-db) keep_db=1; shift ;;
	--passes) passes="$2"; shift 2 ;;
	--env) service_env+=("$2"); shift 2 ;;
	--markdown) markdown="$2"; shift 2 ;;
	--compare-with) compare="$2"; shift 2 ;;
	--) shift; extra=("$@"); break ;;
	-h|--help) sed -n '2,20p' "$0"; exit 0 ;;
	*) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done

pg_admin=${PG_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=${BENCH_OUT:-bench-out/$stamp}
mkdir -p "$out"
db="subscriberd_bench_$(date -u +%Y%m%d%H%M%S)_$$"
db_url="${pg_admin%%\?*}"
db_url="${db_url%/*}/$db?sslmode=disable"

# A free loopback port: bind port 0 and report what the kernel chose.
free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
port=${BENCH_PORT:-$(free_port)}
admin_port=${BENCH_ADMIN_PORT:-$(free_port)}
while [ "$admin_port" = "$port" ]; do admin_port=$(free_port); done

service_pid=
cleanup() {
	status=$?
	if [ -n "$service_pid" ] && kill -0 "$service_pid" 2>/dev/null; then
		kill -TERM "$service_pid" 2>/dev/null || true
		for _ in $(seq 1 50); do kill -0 "$service_pid" 2>/dev/null || break; sleep 0.2; done
		kill -KILL "$service_pid" 2>/dev/null || true
	fi
	if [ "$keep_db" = 0 ]; then
		psql "$pg_admin" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
	else
		echo "kept database $db" >&2
	fi
	exit $status
}
trap cleanup EXIT INT TERM

echo "== build" >&2
go build -o bin/subscriberd ./cmd/subscriberd
go build -o bin/subscriber-bench ./cmd/subscriber-bench

echo "== fresh database $db" >&2
psql "$pg_admin" -qAtc "CREATE DATABASE $db" >/dev/null

export DATABASE_URL="$db_url"
export LISTEN_ADDR="127.0.0.1:$port" ADMIN_ADDR="127.0.0.1:$admin_port"
export RATE_LIMITS=off BULK_RATE_LIMITS=off AUTH_LOCKOUT=off WRITE_LOCKOUT=off
export LOG_LEVEL=warn
bin/subscriberd migrate >/dev/null 2>"$out/migrate.log"

newsletter=$(bin/subscriberd newsletter create --name "bench $stamp" | jq -er .id)
key=$(bin/subscriberd apikey create --newsletter "$newsletter" --label bench | jq -er .key)

echo "== start the service on $LISTEN_ADDR (admin $ADMIN_ADDR)" >&2
env "${service_env[@]}" bin/subscriberd serve 2>"$out/service.log" &
service_pid=$!
for _ in $(seq 1 100); do
	if curl -fsS "http://$ADMIN_ADDR/readyz" >/dev/null 2>&1; then break; fi
	if ! kill -0 "$service_pid" 2>/dev/null; then
		echo "the service exited; its log:" >&2; cat "$out/service.log" >&2; exit 1
	fi
	sleep 0.1
done
curl -fsS "http://$ADMIN_ADDR/readyz" >/dev/null

args=(-url "http://$LISTEN_ADDR" -key "$key" -database-url "$db_url" -newsletter "$newsletter"
	-seed "$subscribers" -clients 16 -check-clients 64,256 -pid "$service_pid"
	-passes "$passes" -json "$out/bench.json" -label "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
	-command "$invocation")
if [ ${#service_env[@]} -gt 0 ]; then args+=(-label "$(git rev-parse --short HEAD 2>/dev/null || echo unknown) ${service_env[*]}"); fi
if [ -n "$markdown" ]; then args+=(-markdown "$markdown"); fi
if [ -n "$compare" ]; then args+=(-compare-with "$compare"); fi
if [ "$million" = 1 ]; then args+=(-scale-to 1000000); fi
if [ "$profile" = 1 ]; then args+=(-pprof-url "http://$ADMIN_ADDR" -profile-dir "$out/profiles"); fi

echo "== run (results in $out)" >&2
rc=0
bin/subscriber-bench "${args[@]}" "${extra[@]}" | tee "$out/table.txt" || rc=$?
echo "JSON: $out/bench.json   table: $out/table.txt   service log: $out/service.log" >&2
exit $rc
