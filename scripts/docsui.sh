#!/usr/bin/env bash
# Refreshes the reference UI embedded in the binary (api/docsui) from the npm registry:
# swagger-ui-dist at the pinned VERSION, its bundle, stylesheet and licence files only.
# Usage: scripts/docsui.sh [VERSION]   (then update the version in api/docsui/README.md)
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-5.31.1}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "swagger-ui-dist@$version" >/dev/null && tar xzf swagger-ui-dist-*.tgz)
for f in swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt swagger-ui.css LICENSE NOTICE; do
  cp "$tmp/package/$f" api/docsui/
done
echo "api/docsui: swagger-ui-dist@$version" >&2
