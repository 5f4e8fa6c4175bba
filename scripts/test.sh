#!/usr/bin/env bash
# test.sh: install what the tests need, build the test guest, run every test.
# Tests start their own systemd (in a PID namespace when PID 1 is not systemd),
# QEMU guests and services, and stop them at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
scripts/install-deps.sh
scripts/build-guest.sh
go vet ./...
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then echo "gofmt: not formatted: $unformatted" >&2; exit 1; fi
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
exec go test -count=1 -timeout 60m ./... "$@"
