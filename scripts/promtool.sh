#!/usr/bin/env bash
# Checks and unit-tests the Prometheus rules (deploy/prometheus/rules.yml, rules_test.yml)
# with promtool.
#
# promtool comes from Debian's "prometheus" package, unpacked WITHOUT installing it (no
# server, no service, no users): apt-get download + dpkg-deb -x into a cache directory.
# Set PROMTOOL to use another binary. Usage: scripts/promtool.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${PROMTOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/subscriberd/promtool}"

promtool="${PROMTOOL:-}"
if [[ -z "$promtool" ]]; then
	if command -v promtool >/dev/null 2>&1; then
		promtool="$(command -v promtool)"
	else
		promtool="$cache/usr/bin/promtool"
	fi
fi

if [[ ! -x "$promtool" ]]; then
	echo "promtool: unpacking Debian's prometheus package into $cache" >&2
	tmp="$(mktemp -d)"
	trap 'rm -rf "$tmp"' EXIT
	# apt-get download needs the package lists; fetch them once if they are missing.
	if ! (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1); then
		apt-get update -qq >/dev/null
		(cd "$tmp" && apt-get download prometheus >/dev/null 2>&1)
	fi
	mkdir -p "$cache"
	dpkg-deb -x "$tmp"/prometheus_*.deb "$cache"
	promtool="$cache/usr/bin/promtool"
fi

"$promtool" --version 2>&1 | head -n1
cd "$root/deploy/prometheus"
"$promtool" check rules rules.yml
"$promtool" test rules rules_test.yml
# prometheus.yml is not checked here: it uses Prometheus 3 settings (scrape_native_histograms,
# otlp) that Debian's promtool 2.42 rejects; deploy/deploy_test.go checks its structure.
