#!/usr/bin/env bash
# deadcode.sh: fail on a function nothing reaches (from main packages and
# tests) unless scripts/deadcode-accepted.txt lists it with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."
found=$(go run golang.org/x/tools/cmd/deadcode@v0.53.0 -test ./... |
	sed -E 's/^([^:]+):[0-9]+:[0-9]+: unreachable func: (.*)$/\1 \2/' | sort)
accepted=$(grep -v '^#' scripts/deadcode-accepted.txt | grep -v '^$' | sort)
new=$(comm -23 <(echo "$found") <(echo "$accepted") | grep -v '^$' || true)
if [ -n "$new" ]; then
	echo "deadcode: unreachable functions (remove them, or list them with a reason in scripts/deadcode-accepted.txt):" >&2
	echo "$new" >&2
	exit 1
fi
gone=$(comm -13 <(echo "$found") <(echo "$accepted") | grep -v '^$' || true)
if [ -n "$gone" ]; then
	echo "deadcode: scripts/deadcode-accepted.txt lists what is no longer found (remove the lines): $gone" >&2
	exit 1
fi
