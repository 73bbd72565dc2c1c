#!/usr/bin/env bash
# Generates the typed TypeScript client of the OpenAPI document (api/testdata/openapi.json, the
# golden copy of what the service serves) with openapi-typescript and compiles, with
# tsc --strict --noEmit, an integrator's code that uses it with no cast
# (api/testdata/tsclient/check.ts: attributes, tags, the attr deepObject filter, GET /tags, the
# tags operation). A document that stops describing those as the contract has them fails it.
#
# The packages are pinned (api/testdata/tsclient/package.json and its lock) and installed with
# npm ci into a cache directory named after the lock's hash, npm's own cache beside it: a second
# run needs no network. Without node and npm, or when npm cannot install them (offline, registry
# down), the check is SKIPPED, loudly, and the script succeeds. Usage: scripts/tsclient.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pkg="$root/api/testdata/tsclient"
cache="${TSCLIENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/subscriberd}"

skip() {
	echo "############################################################################" >&2
	echo "## NO TYPESCRIPT CLIENT CHECK: $1" >&2
	echo "## The generated client's compile check (scripts/tsclient.sh) is SKIPPED.  ##" >&2
	echo "############################################################################" >&2
	exit 0
}

command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || skip "node and npm are not installed."

lock_hash=$(sha256sum "$pkg/package-lock.json" | cut -c1-16)
modules="$cache/tsclient-$lock_hash"
if [[ ! -x "$modules/node_modules/.bin/tsc" ]]; then
	echo "tsclient: installing the pinned packages into $modules" >&2
	rm -rf "$modules" && mkdir -p "$modules"
	cp "$pkg/package.json" "$pkg/package-lock.json" "$modules/"
	if ! (cd "$modules" && NO_UPDATE_NOTIFIER=1 npm ci --no-audit --no-fund --ignore-scripts --prefer-offline \
		--cache "$cache/npm" >/dev/null 2>"$modules/npm.log"); then
		cat "$modules/npm.log" >&2
		rm -rf "$modules"
		skip "npm could not install the pinned packages (offline?)."
	fi
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$pkg/check.ts" "$pkg/tsconfig.json" "$work/"
ln -s "$modules/node_modules" "$work/node_modules"
"$modules/node_modules/.bin/openapi-typescript" "$root/api/testdata/openapi.json" -o "$work/schema.d.ts" --silent
cd "$work"
"$modules/node_modules/.bin/tsc" --version
"$modules/node_modules/.bin/tsc" -p tsconfig.json
echo "tsclient: the generated client compiles with the §19 fields, no casts" >&2
