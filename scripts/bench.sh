#!/usr/bin/env bash
# Benchmark subscriberd end to end on this machine (issue 6): build the service and the load
# tool, start the service on a fresh database of the local PostgreSQL with every limit off,
# make a newsletter and an API key with the CLI, seed it through the bulk API, run every
# scenario and its raw-SQL baseline, print the report in Markdown and write it as JSON. A scenario judged
# against another of the service's of like latency (replay against get, create_idem against
# create_active, …) also runs with it in alternating half-second slices in every pass, and is
# judged on those.
#
# It also prices telemetry on the official OpenTelemetry components (issue 20): three more
# instances of the same binary run on the same database, newsletter and key, "off"
# (OTEL_SDK_DISABLED=true, LOG_LEVEL=warn: no traces, no access log), "on"
# (OTEL_TRACES_SAMPLER=always_on) and "production" (OTEL_TRACES_SAMPLER=parentbased_traceidratio,
# OTEL_TRACES_SAMPLER_ARG=0.1, the setting docs/operating.md recommends), the last two exporting
# over OTLP/HTTP with the official exporter to a receiver the tool serves on loopback, with the
# JSON access log at LOG_LEVEL=info; Prometheus metrics cannot be switched off and stay on in
# all. In every pass the tool runs the telemetry scenarios (get, list_first, create_active,
# update; -telemetry-scenarios changes them, -only does not) on off and on, then on off and
# production, each pair in alternating half-second slices (off on on off …, -telemetry-slice),
# 20 s each (-telemetry-duration), and prints the overhead of each setting in a second table
# against the targets (production ≤ 5 %; 100 % ≤ 20 % on get, ≤ 10 % on the others). The main
# instance is started as before, and its table means what it meant.
#
# The webhook pairs (issue 22) measure update, create_active and bulk_100 without an endpoint,
# with one whose deliveries the main instance makes meanwhile, and with one whose deliveries
# are only queued: those writes go to a "queue-only" instance (WEBHOOK_WORKERS=0, the rest as
# the main one) while the tool pauses the main instance (SIGSTOP), the only one with workers.
# The queue-only and comparison instances run no background work at all (EMAIL_WORKERS=0,
# WEBHOOK_WORKERS=0, IMPORT_WORKERS=0, BULK_ACTION_WORKERS=0): the main instance alone sends the emails, delivers the
# webhooks and processes the imports, so that what the import scenarios measure is the main
# instance's work, not three idle instances' workers draining the import's emails beside it. In every pass the queued writes
# also alternate, in half-second slices on the queue-only instance, with the same writes to a
# second newsletter that has no endpoint, and the queued ratio is judged on those.
#
# Every measured run of the main instance and of the baseline also says where PostgreSQL's time
# goes (issue 43), per request: statements and their mean execution time (pg_stat_statements),
# WAL bytes, and wait events sampled from pg_stat_activity, lock waits among them. The
# statements need a server that loads pg_stat_statements (shared_preload_libraries): on one
# that does not, the tool says so and shows the rest; PG_ADMIN_URL can name one that does.
#
# The main instance sends its emails over SMTP to a receiver the tool serves. After the
# million-row import, segment_count and bulk_tag_1m run on its newsletter, and a single create
# in the second newsletter is timed during bulk work, to the SMTP and webhook receivers (48, 50).
#
#   scripts/bench.sh [--quick] [--subscribers N] [--million] [--import-only] [--passes N] [--profile] [--keep-db]
#                    [--env NAME=VALUE]... [--no-telemetry] [--telemetry-env NAME=VALUE]...
#                    [--off-env NAME=VALUE]... [--on-env NAME=VALUE]... [--prod-env NAME=VALUE]...
#                    [--markdown FILE] [--compare-with JSON] [-- tool flags]
#
#   --quick           a check that every scenario still runs, in about 4 minutes: 3,000 subscribers,
#                     1 s per scenario, checks at 32 clients, 20,000 import rows, telemetry on get
#                     only; its figures are not for comparison
#   --million         also seed up to 1M subscribers at the end and measure the first page again
#   --import-only     only the million-row part: the import of 1,000,000 rows with its variants,
#                     the attribute and tag reads on the newsletter after it (list_tag, list_attr,
#                     tags_list), segment_count and bulk_tag_1m (a single create in the second
#                     newsletter timed during it and during the pending variant), after seeding
#                     1,000 subscribers (--subscribers changes it); no other scenario, no
#                     telemetry, webhooks or checks
#   --passes N        N passes of the measured run; the table shows medians (~3 min per pass)
#   --profile         CPU profiles and goroutine dumps from the admin listener into the output
#   --env NAME=VALUE  extra environment of the main service and of the queue-only one (e.g. LOG_LEVEL=info)
#   --no-telemetry    skip the telemetry comparison (no "off", "on" and "production" instances; ~3 min less a pass)
#   --telemetry-env NAME=VALUE  extra environment of both comparison instances (e.g. GOGC=200)
#   --off-env NAME=VALUE, --on-env NAME=VALUE, --prod-env NAME=VALUE  extra environment of the "off", "on" or "production" instance
#                     only, over its telemetry settings, to price one part of telemetry: e.g.
#                     --on-env LOG_LEVEL=warn (no access log), --on-env OTEL_EXPORTER_OTLP_ENDPOINT=
#                     (spans recorded, not exported); @SINK@ in VALUE is the OTLP receiver's URL
#   --markdown FILE   also write the results as Markdown (e.g. docs/benchmarks.md)
#   --compare-with J  set each measured scenario against an earlier run's bench.json
#
# Environment: PG_ADMIN_URL (default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable),
# BENCH_PORT / BENCH_ADMIN_PORT (default: free ports), BENCH_OUT (default bench-out/<time>).
# Logs: $out/service.log, service-queue-only.log, service-telemetry-off.log, service-telemetry-on.log, service-telemetry-production.log.
set -euo pipefail

cd "$(dirname "$0")/.."
invocation="scripts/bench.sh${*:+ $*}"

subscribers=100000
subscribers_given=0
million=0
import_only=0
profile=0
keep_db=0
passes=1
markdown=
compare=
telemetry=1
service_env=()
telemetry_env=()
off_env=()
on_env=()
prod_env=()
extra=()
quick=()
while [ $# -gt 0 ]; do
	case "$1" in
	--subscribers) subscribers="$2"; subscribers_given=1; shift 2 ;;
	--quick) subscribers=3000; quick=(-duration 1s -warmup 300ms -check-clients 32 -check-duration 1s -import-rows 20000
		-telemetry-duration 1s -telemetry-scenarios get); shift ;;
	--million) million=1; shift ;;
	--import-only) import_only=1; telemetry=0; shift ;;
	--profile) profile=1; shift ;;
	--keep-db) keep_db=1; shift ;;
	--passes) passes="$2"; shift 2 ;;
	--env) service_env+=("$2"); shift 2 ;;
	--no-telemetry) telemetry=0; shift ;;
	--telemetry-env) telemetry_env+=("$2"); shift 2 ;;
	--off-env) off_env+=("$2"); shift 2 ;;
	--on-env) on_env+=("$2"); shift 2 ;;
	--prod-env) prod_env+=("$2"); shift 2 ;;
	--markdown) markdown="$2"; shift 2 ;;
	--compare-with) compare="$2"; shift 2 ;;
	--) shift; extra=("$@"); break ;;
	-h|--help) sed -n '2,71p' "$0"; exit 0 ;;
	*) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
if [ "$import_only" = 1 ] && [ "$subscribers_given" = 0 ]; then subscribers=1000; fi

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
# The comparison instances' listeners and the tool's OTLP receiver: more ports, all
# different from each other and from the main instance's (other_port runs in a subshell, so
# the caller records each port it gets in $taken).
taken=" $port $admin_port "
other_port() {
	local p
	p=$(free_port)
	while [[ "$taken" == *" $p "* ]]; do p=$(free_port); done
	echo "$p"
}
# The tool's SMTP receiver, which the main instance sends its confirmation emails to.
smtp_port=$(other_port); taken+="$smtp_port "
queue_port=$(other_port); taken+="$queue_port "
queue_admin_port=$(other_port); taken+="$queue_admin_port "
if [ "$telemetry" = 1 ]; then
	off_port=$(other_port); taken+="$off_port "
	off_admin_port=$(other_port); taken+="$off_admin_port "
	on_port=$(other_port); taken+="$on_port "
	on_admin_port=$(other_port); taken+="$on_admin_port "
	prod_port=$(other_port); taken+="$prod_port "
	prod_admin_port=$(other_port); taken+="$prod_admin_port "
	sink_port=$(other_port)
	sink_url="http://127.0.0.1:$sink_port"
fi

service_pid=
queue_pid=
off_pid=
on_pid=
prod_pid=
# stop PID...: SIGTERM to each, up to 10 s for them to drain, then SIGKILL to what is left.
stop() {
	local pid live
	for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
	for _ in $(seq 1 50); do
		live=0
		for pid in "$@"; do if kill -0 "$pid" 2>/dev/null; then live=1; fi; done
		[ "$live" = 1 ] || break
		sleep 0.2
	done
	for pid in "$@"; do kill -KILL "$pid" 2>/dev/null || true; done
}
cleanup() {
	status=$?
	# The tool may have left the main instance paused (SIGSTOP) if it was interrupted.
	if [ -n "$service_pid" ]; then kill -CONT "$service_pid" 2>/dev/null || true; fi
	# shellcheck disable=SC2086 # the unset ones vanish
	stop $service_pid $queue_pid $off_pid $on_pid $prod_pid
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
# The webhook scenarios deliver to a receiver on loopback, which the service refuses by default.
export WEBHOOK_ALLOW_PRIVATE=true
# Emails go over SMTP to the tool's receiver, which accepts each at once (it listens from the
# tool's start: nothing queues an email before).
export SMTP_URL="smtp://127.0.0.1:$smtp_port"
export LOG_LEVEL=warn
bin/subscriberd migrate >/dev/null 2>"$out/migrate.log"

newsletter=$(bin/subscriberd newsletter create --name "bench $stamp" | jq -er .id)
key=$(bin/subscriberd apikey create --newsletter "$newsletter" --label bench | jq -er .key)
# A second newsletter, never given a webhook endpoint, for the queued writes to alternate with.
plain_newsletter=$(bin/subscriberd newsletter create --name "bench $stamp without webhooks" | jq -er .id)
plain_key=$(bin/subscriberd apikey create --newsletter "$plain_newsletter" --label bench | jq -er .key)

# wait_ready PID ADMIN_ADDR LOG: wait until the instance answers /readyz, or fail with its log.
wait_ready() {
	for _ in $(seq 1 100); do
		if curl -fsS "http://$2/readyz" >/dev/null 2>&1; then break; fi
		if ! kill -0 "$1" 2>/dev/null; then
			echo "the service exited; its log:" >&2; cat "$3" >&2; exit 1
		fi
		sleep 0.1
	done
	curl -fsS "http://$2/readyz" >/dev/null
}

echo "== start the service on $LISTEN_ADDR (admin $ADMIN_ADDR)" >&2
env "${service_env[@]}" bin/subscriberd serve 2>"$out/service.log" &
service_pid=$!
wait_ready "$service_pid" "$ADMIN_ADDR" "$out/service.log"

# Every instance but the main one runs no workers: pausing the main one stops delivery, and
# only the main one sends emails and processes imports.
export WEBHOOK_WORKERS=0 EMAIL_WORKERS=0 IMPORT_WORKERS=0 BULK_ACTION_WORKERS=0
echo "== start the queue-only instance (no workers) on 127.0.0.1:$queue_port" >&2
env LISTEN_ADDR="127.0.0.1:$queue_port" ADMIN_ADDR="127.0.0.1:$queue_admin_port" "${service_env[@]}" \
	WEBHOOK_WORKERS=0 EMAIL_WORKERS=0 IMPORT_WORKERS=0 BULK_ACTION_WORKERS=0 \
	bin/subscriberd serve 2>"$out/service-queue-only.log" &
queue_pid=$!
wait_ready "$queue_pid" "127.0.0.1:$queue_admin_port" "$out/service-queue-only.log"

if [ "$telemetry" = 1 ]; then
	# The same binary, database, newsletter and key; only the telemetry settings differ
	# (LISTEN_ADDR, ADMIN_ADDR and LOG_LEVEL here override the exported ones).
	echo "== start telemetry off on 127.0.0.1:$off_port, on on 127.0.0.1:$on_port and production on 127.0.0.1:$prod_port (OTLP to 127.0.0.1:$sink_port)" >&2
	env LISTEN_ADDR="127.0.0.1:$off_port" ADMIN_ADDR="127.0.0.1:$off_admin_port" \
		OTEL_SDK_DISABLED=true LOG_LEVEL=warn "${telemetry_env[@]}" "${off_env[@]//@SINK@/$sink_url}" \
		bin/subscriberd serve 2>"$out/service-telemetry-off.log" &
	off_pid=$!
	env LISTEN_ADDR="127.0.0.1:$on_port" ADMIN_ADDR="127.0.0.1:$on_admin_port" \
		OTEL_EXPORTER_OTLP_ENDPOINT="$sink_url" OTEL_TRACES_SAMPLER=always_on LOG_LEVEL=info \
		"${telemetry_env[@]}" "${on_env[@]//@SINK@/$sink_url}" \
		bin/subscriberd serve 2>"$out/service-telemetry-on.log" &
	on_pid=$!
	env LISTEN_ADDR="127.0.0.1:$prod_port" ADMIN_ADDR="127.0.0.1:$prod_admin_port" \
		OTEL_EXPORTER_OTLP_ENDPOINT="$sink_url" OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.1 LOG_LEVEL=info \
		"${telemetry_env[@]}" "${prod_env[@]//@SINK@/$sink_url}" \
		bin/subscriberd serve 2>"$out/service-telemetry-production.log" &
	prod_pid=$!
	wait_ready "$off_pid" "127.0.0.1:$off_admin_port" "$out/service-telemetry-off.log"
	wait_ready "$on_pid" "127.0.0.1:$on_admin_port" "$out/service-telemetry-on.log"
	wait_ready "$prod_pid" "127.0.0.1:$prod_admin_port" "$out/service-telemetry-production.log"
fi

args=(-url "http://$LISTEN_ADDR" -key "$key" -database-url "$db_url" -newsletter "$newsletter"
	-seed "$subscribers" -clients 16 -check-clients 64,256 -pid "$service_pid" -import-rows 1000000
	-smtp-receiver "127.0.0.1:$smtp_port" -webhook-queue-url "http://127.0.0.1:$queue_port" -webhook-queue-pid "$queue_pid" -webhook-plain-key "$plain_key"
	-passes "$passes" -json "$out/bench.json" -label "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
	-command "$invocation")
if [ ${#service_env[@]} -gt 0 ]; then args+=(-label "$(git rev-parse --short HEAD 2>/dev/null || echo unknown) ${service_env[*]}"); fi
if [ -n "$markdown" ]; then args+=(-markdown "$markdown"); fi
if [ -n "$compare" ]; then args+=(-compare-with "$compare"); fi
if [ "$million" = 1 ]; then args+=(-scale-to 1000000); fi
if [ "$import_only" = 1 ]; then args+=(-only import_1m -webhooks=false -check-clients ''); fi
if [ "$profile" = 1 ]; then args+=(-pprof-url "http://$ADMIN_ADDR" -profile-dir "$out/profiles"); fi
if [ "$telemetry" = 1 ]; then
	args+=(-telemetry-off-url "http://127.0.0.1:$off_port" -telemetry-off-pid "$off_pid"
		-telemetry-on-url "http://127.0.0.1:$on_port" -telemetry-on-pid "$on_pid"
		-telemetry-prod-url "http://127.0.0.1:$prod_port" -telemetry-prod-pid "$prod_pid"
		-otlp-sink "127.0.0.1:$sink_port")
fi

echo "== run (results in $out)" >&2
rc=0
bin/subscriber-bench "${args[@]}" "${quick[@]}" "${extra[@]}" | tee "$out/report.md" || rc=$?
echo "JSON: $out/bench.json   report: $out/report.md   service log: $out/service.log" >&2
if [ "$telemetry" = 1 ]; then
	echo "telemetry logs: $out/service-telemetry-off.log $out/service-telemetry-on.log $out/service-telemetry-production.log" >&2
fi
exit $rc
