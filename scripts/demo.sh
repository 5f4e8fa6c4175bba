#!/usr/bin/env bash
# demo.sh: boot a real VM from examples/demo.toml under vmsup and show it
# working: console output, status, pause/resume, a QMP query, a command typed
# on the serial console, and a graceful ACPI shutdown.
# Installs what it needs (packages, test guest). Where PID 1 is not systemd it
# runs a private systemd in its own PID namespace and points vmsup at it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
scripts/install-deps.sh
scripts/build-guest.sh
mkdir -p bin
go build -o bin/vmsup ./cmd/vmsup
go build -o bin/vmsup-sandbox ./internal/dev/sandbox

work=$(mktemp -d /tmp/vmsup-demo.XXXXXX)
export VMSUP_ROOT=$work/root
sandbox_pid=
cleanup() {
	bin/vmsup down demo >/dev/null 2>&1 || true
	if [[ -n $sandbox_pid ]]; then kill "$sandbox_pid" 2>/dev/null && wait "$sandbox_pid" || true; fi
	rm -rf "$work"
}
trap cleanup EXIT

if [[ $(cat /proc/1/comm) != systemd ]]; then
	echo "== PID 1 is not systemd: starting a private systemd for the demo"
	bin/vmsup-sandbox -dir "$work/systemd" -env "$work/env" &
	sandbox_pid=$!
	for _ in $(seq 300); do [[ -s $work/env ]] && break; kill -0 $sandbox_pid || exit 1; sleep 0.1; done
	set -a; . "$work/env"; set +a
	systemctl() { nsenter -t "$SANDBOX_PID1" -m -p systemctl "$@"; }
	journalctl() { command journalctl -D "$VMSUP_JOURNAL_DIR" "$@"; }
	# status measures the unit's exposure with systemd-analyze, which must run beside that systemd.
	export VMSUP_SYSTEMD_ANALYZE="nsenter -t $SANDBOX_PID1 -m -p systemd-analyze"
fi

step() { echo; echo "== $*"; }
step "vmsup validate examples/demo.toml"; bin/vmsup validate examples/demo.toml
step "vmsup argv examples/demo.toml"; bin/vmsup argv examples/demo.toml
step "vmsup up examples/demo.toml"; bin/vmsup up examples/demo.toml
step "vmsup up again (idempotent)"; bin/vmsup up examples/demo.toml
log=$VMSUP_ROOT/vms/demo/console.log
step "waiting for the guest's console"
for _ in $(seq 600); do grep -q VMSUP-SHELL-READY "$log" 2>/dev/null && break; sleep 0.1; done
grep -a -E 'Linux version|VMSUP-' "$log" | head -5
step "vmsup ping demo (the guest agent)"
for _ in $(seq 50); do bin/vmsup ping demo 2>/dev/null && break; sleep 0.2; done
step "vmsup status demo"; bin/vmsup status demo
step "systemctl status vmsup-demo.service"; systemctl status --no-pager vmsup-demo.service | head -8 || true
step "vmsup pause demo"; bin/vmsup pause demo
bin/vmsup qmp demo '{"execute":"query-status"}'
step "vmsup resume demo"; bin/vmsup resume demo
bin/vmsup qmp demo '{"execute":"query-status"}'
step "typing 'uname -a; cat /proc/cpuinfo | grep -m1 \"model name\"' on the serial console"
printf 'uname -a; grep -m1 "model name" /proc/cpuinfo\n' | bin/vmsup console demo | grep -a -E 'Linux|model name' | tail -2
step "vmsup ls"; bin/vmsup ls
step "vmsup down demo (ACPI powerdown)"; bin/vmsup down demo
tail -2 "$log"
step "vmsup status demo"; bin/vmsup status demo
step "journalctl -u vmsup-demo.service"; journalctl -u vmsup-demo.service --no-pager -o short | tail -5
echo; echo "demo finished"
