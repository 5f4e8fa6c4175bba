#!/usr/bin/env bash
# install-deps.sh: install the Debian 12 packages vmsup, its demo and its tests use.
# Idempotent and quick when everything is there. Daemons from these packages are
# never started by the install (policy-rc.d), tests start what they need themselves.
set -euo pipefail
PKGS=(qemu-system-x86 qemu-utils qemu-block-extra ovmf qemu-system-data busybox-static
	qemu-guest-agent xz-utils dbus systemd util-linux iproute2 apparmor apparmor-utils
	openvswitch-switch containernetworking-plugins
	make gcc ca-certificates acl # acl: getfacl, the fault suite reads grants with it
	tgt ceph-mon ceph-osd ceph-common # storage tests: iSCSI target, single-node Ceph
	swtpm swtpm-tools sbsigntool # [tpm]; the Secure Boot test signs a guest kernel
	nftables dnsmasq-base dnsmasq-utils # managed networks: nft for tests, dnsmasq per network, dhcp_release
	novnc chromium # vmsup console --web serves Debian's noVNC; the display test looks at it in headless Chromium
	prometheus # the metrics test scrapes vmsup with a real Prometheus (and promtool checks the format)
	docker-registry # the image store's tests pull containerDisks from a real OCI registry on loopback
	podman) # ...pushed there by the containerDisk recipe of docs/images-and-profiles.md
missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "install-deps: installing ${missing[*]}" >&2
	made_policy=
	if [[ ! -e /usr/sbin/policy-rc.d ]]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
		made_policy=1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >&2
	apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${missing[@]}" >&2
	[[ -n $made_policy ]] && rm -f /usr/sbin/policy-rc.d
	# The tests start their own Prometheus and registry; those installed here must not start at the next boot.
	for svc in prometheus docker-registry; do
		if [[ " ${missing[*]} " == *" $svc "* ]] && command -v systemctl >/dev/null; then
			systemctl disable "$svc.service" >/dev/null 2>&1 || true
		fi
	done
	# podman's package enables its API socket and services; the recipe's test runs podman as a plain command.
	if [[ " ${missing[*]} " == *" podman "* ]] && command -v systemctl >/dev/null; then
		systemctl disable podman.socket podman.service podman-restart.service podman-auto-update.service podman-auto-update.timer >/dev/null 2>&1 || true
	fi
fi
# QEMU runs as this unprivileged system user (vmsup also creates it when missing).
if ! getent passwd vmsup-qemu >/dev/null; then
	echo "install-deps: creating system user vmsup-qemu" >&2
	useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin vmsup-qemu
fi
# QEMU 10 from bookworm-backports in a private prefix: the suite runs again under it.
"$(dirname "$0")/install-qemu10.sh"
# Go: this project needs the Go toolchain named in go.mod (Debian 12's golang is too old).
if ! command -v go >/dev/null 2>&1; then
	if [[ -x /usr/local/go/bin/go ]]; then
		echo "install-deps: add /usr/local/go/bin to PATH" >&2
	else
		echo "install-deps: Go $(sed -n 's/^go //p' "$(dirname "$0")/../go.mod") or newer is required; install it to /usr/local/go" >&2
	fi
	exit 1
fi
