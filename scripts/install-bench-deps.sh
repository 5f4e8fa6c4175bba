#!/usr/bin/env bash
# install-bench-deps.sh: what `make bench` needs beyond install-deps.sh: libvirt
# (monolithic libvirtd 9.0 + virtlogd + virsh) as the baseline, and tini to reap
# libvirt's QEMU children at once. The benchmark starts and stops libvirtd itself;
# the install must not start it (policy-rc.d), nor leave it enabled to run.
set -euo pipefail
bash "$(dirname "$0")/install-deps.sh"
PKGS=(libvirt-daemon-system libvirt-clients tini)
missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "install-bench-deps: installing ${missing[*]}" >&2
	made_policy=
	if [[ ! -e /usr/sbin/policy-rc.d ]]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
		made_policy=1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get -o DPkg::Lock::Timeout=600 update -q >&2
	apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}" >&2
	[[ -n $made_policy ]] && rm -f /usr/sbin/policy-rc.d
fi
for b in libvirtd virtlogd virsh tini-static; do
	command -v "$b" >/dev/null 2>&1 || [[ -x /usr/sbin/$b || -x /usr/bin/$b ]] || {
		echo "install-bench-deps: $b missing after install" >&2
		exit 1
	}
done
