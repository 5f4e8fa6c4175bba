#!/usr/bin/env bash
# test.sh: install what the tests need, build the test guest, run every test.
# Tests start their own systemd (in a PID namespace when PID 1 is not systemd),
# QEMU guests and services, and stop them at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
scripts/install-deps.sh
scripts/build-guest.sh
# The real Debian 12 guest of supervisor/realguesttest (debootstrap from Debian's archive, ~4 min
# cold, cached): where it cannot be built, that package's tests skip with the script's reason.
scripts/build-real-guest.sh || echo "test.sh: the real guest could not be built: supervisor/realguesttest skips" >&2
# Each test VM's QEMU runs as its own system user (vmsupq-*, made by vmsup);
# remove the ones this run made when it ends.
users_before=$(getent passwd | cut -d: -f1 | grep '^vmsupq-' | sort || true)
remove_test_users() {
	comm -13 <(echo "$users_before") <(getent passwd | cut -d: -f1 | grep '^vmsupq-' | sort || true) |
		while read -r u; do [ -n "$u" ] && userdel "$u" 2>/dev/null || true; done
}
trap remove_test_users EXIT
go vet ./...
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then echo "gofmt: not formatted: $unformatted" >&2; exit 1; fi
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
scripts/deadcode.sh
# The packages that boot the most guests first: go test runs two packages
# at a time here (2 cores) and starts them in the order given; the real
# guest's (its boots are minutes each under TCG) before all.
# Every pass runs even when one before it failed (a flake in the first must
# not hide what QEMU 10 does); the script fails if any did.
t0=$SECONDS
rc=0
go test -count=1 -timeout 60m ./supervisor/realguesttest/ ./supervisor/faulttest/ ./supervisor/faultsnaptest/ ./supervisor/ ./supervisor/snapshottest/ ./fleet/fleettest/ ./cmd/vmsup/ ./... "$@" || rc=1
echo "test.sh: main pass took $(((SECONDS - t0) / 60))m$(((SECONDS - t0) % 60))s"

# Host variants: CI and development machines may be Intel or AMD, with full,
# PVM or no KVM. The tests that depend on KVM run again (1) with a QEMU that
# aborts on "-cpu host" under KVM as QEMU 7.2 does on an AMD host with PVM KVM
# (scripts/testing/qemu-abort-host), and (2) with /dev/kvm hidden. Each must
# pass or skip with the host probe's reason.
kvm_tests='TestKVM|TestGoldenArgsStartInQEMU|TestProbe|TestCPUChoices|TestCLIHost|TestCLIBadInput'
kvm_pkgs=(./internal/host/caps ./qemuargs ./supervisor ./cmd/vmsup)
# The confined QEMU user must reach the stand-in: not under /root or /tmp.
standin=/usr/local/libexec/vmsup-test/qemu-abort-host
install -D -m 0755 scripts/testing/qemu-abort-host "$standin"
echo "test.sh: host variant: QEMU that aborts on -cpu host under KVM ($standin)"
VMSUP_TEST_QEMU=$standin go test -count=1 -timeout 20m -run "$kvm_tests" "${kvm_pkgs[@]}" || rc=1
if [ -e /dev/kvm ]; then
	echo "test.sh: host variant: /dev/kvm hidden (a private mount namespace binds /dev/null over it)"
	unshare -m --propagation private bash -c 'mount --bind /dev/null /dev/kvm && exec go test -count=1 -timeout 20m -run "$0" "${@}"' \
		"$kvm_tests" "${kvm_pkgs[@]}" || rc=1
else
	echo "test.sh: host variant: no /dev/kvm on this host: every run above was already without KVM"
fi

# The real host: vmsup's own Debian package (scripts/build-deb.sh) installed and used on a Debian 12
# host VM (scripts/build-real-host.sh: systemd as PID 1, cgroup v2 only, AppArmor enforcing), booted
# under TCG, its demo VM nested, a reboot with vmsup enable. Its own step with its own bound: 5m44s
# and 6m57s at a load of 5-8 on 2 cores (nested KVM), plus ~2 minutes for a cold image build; nested TCG
# (an outer CPU without SVM) is slower. VMSUP_SKIP_REALHOST=1 skips it.
if [[ -z ${VMSUP_SKIP_REALHOST-} ]]; then
	echo "test.sh: real-host test (supervisor/realhosttest)"
	t0=$SECONDS
	VMSUP_REALHOST_TEST=1 go test -count=1 -timeout 40m ./supervisor/realhosttest/ || rc=1
	echo "test.sh: real-host test took $(((SECONDS - t0) / 60))m$(((SECONDS - t0) % 60))s"
fi

# QEMU 10: the QEMU-dependent packages run again with Debian's QEMU 10.0
# (bookworm-backports, fetched into a private prefix by install-deps.sh:
# scripts/install-qemu10.sh) bound over 7.2 in a private mount namespace
# (scripts/testing/with-qemu10). Each test passes or skips with the host
# probe's reason on both QEMUs (docs/qemu-versions.md lists the skips).
# Not every package: the fault suites (~10 min each) kill vmsup at each
# step of operations whose QEMU side the packages below run under 10, and
# the rest start no QEMU or do not depend on its version (the CLI is a
# layer over the supervisor these packages drive; what `vmsup host` says of
# QEMU 10 is internal/host/caps' record). Longest first
# (go test runs two at a time here). VMSUP_SKIP_QEMU10=1 skips the pass.
q10_pkgs=(
	./supervisor/                  # lifecycle, confinement, hotplug, migration, storage on a real guest
	./supervisor/snapshottest/     # memory snapshots through file: with mapped-ram, clones, backups, disk moves
	./supervisor/networktest/      # NICs on bridges, OVS and CNI, hotplug, with QEMU 10's netdevs
	./supervisor/devicetest/       # TPM, 9p, hugepages, Secure Boot, display
	./qemuargs/                    # every golden argv started in QEMU 10 (-S) and checked over QMP
	./internal/host/caps/          # the probe's record of QEMU 10
	./internal/lifecycle/memstate/ # memory state through file: with mapped-ram
)
if [[ -n ${VMSUP_SKIP_QEMU10-} ]]; then
	echo "test.sh: QEMU 10 pass skipped (VMSUP_SKIP_QEMU10 is set)"
	exit $rc
fi
echo "test.sh: QEMU 10 pass ($(scripts/testing/with-qemu10 qemu-system-x86_64 --version | head -n1)): ${q10_pkgs[*]}"
t0=$SECONDS
scripts/testing/with-qemu10 go test -count=1 -timeout 45m "${q10_pkgs[@]}" || rc=1
echo "test.sh: QEMU 10 pass took $(((SECONDS - t0) / 60))m$(((SECONDS - t0) % 60))s"
exit $rc
