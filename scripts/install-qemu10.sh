#!/usr/bin/env bash
# install-qemu10.sh: fetch QEMU 10.0.x from Debian's bookworm-backports into a
# private prefix (default /opt/vmsup/qemu10), never installing it system-wide:
# the test suite runs a second time under it (scripts/testing/with-qemu10).
# Apt runs with its own sources, lists and cache under the prefix, so the
# host's apt configuration is not touched. Idempotent: a prefix whose stamp
# names the wanted packages is left alone.
#
# The prefix must be readable by the confined QEMU users (vmsupq-*): not under
# /root or /tmp.
set -euo pipefail
P=${VMSUP_QEMU10:-/opt/vmsup/qemu10}
PKGS=(qemu-system-x86 qemu-system-common qemu-system-data qemu-utils qemu-block-extra)
stamp="$P/stamp" # its first line changes when what is fetched, or the layout, does
want="layout-2 10.0 ${PKGS[*]}"
if [[ -f $stamp && $(head -n1 "$stamp") == "$want" && -x $P/root/usr/bin/qemu-system-x86_64 ]]; then
	exit 0
fi
echo "install-qemu10: fetching QEMU 10.0 from bookworm-backports into $P" >&2
install -d -m 0755 "$P" "$P/apt/lists/partial" "$P/apt/cache/archives/partial" "$P/debs"
echo "deb http://deb.debian.org/debian bookworm-backports main" >"$P/apt/sources.list"
apt_opts=(-q -o "Dir::Etc::SourceList=$P/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$P/apt/lists" -o "Dir::Cache=$P/apt/cache" -o Debug::NoLocking=1
	-o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" update >&2
ver=$(apt-cache "${apt_opts[@]}" show qemu-system-x86/bookworm-backports | sed -n 's/^Version: //p' | head -n1)
case $ver in
*:10.0.*) ;;
*) echo "install-qemu10: bookworm-backports offers qemu-system-x86 '$ver', not 10.0.x" >&2; exit 1 ;;
esac
rm -f "$P"/debs/*.deb
(cd "$P/debs" && apt-get "${apt_opts[@]}" download "${PKGS[@]/%//bookworm-backports}" >&2)
rm -rf "$P/root.new" && mkdir -m 0755 "$P/root.new"
for d in "$P"/debs/*.deb; do dpkg -x "$d" "$P/root.new"; done
rm -rf "$P/root" && mv "$P/root.new" "$P/root"

# QEMU 10's compiled-in data directory is /usr/share/qemu, as 7.2's: the data
# bound over it is 10's own, plus a link for every entry only 7.2's has (the
# OVMF symlink and firmware descriptors other packages put there, the
# vhost-user descriptors). A symlink is copied with its target resolved; the
# other links lead through qemu72-share, where with-qemu10 binds 7.2's
# directory, so they follow what is installed now.
rm -rf "$P/share-qemu" && cp -a "$P/root/usr/share/qemu" "$P/share-qemu"
install -d -m 0755 "$P/qemu72-share"
for e in /usr/share/qemu/*; do
	n=$(basename "$e")
	if [[ -e $P/share-qemu/$n || -L $P/share-qemu/$n ]]; then
		continue
	elif [[ -L $e ]]; then # its target as seen from /usr/share/qemu (../ovmf/OVMF.fd)
		ln -s "$(readlink -f "$e")" "$P/share-qemu/$n"
	else
		ln -s "$P/qemu72-share/$n" "$P/share-qemu/$n"
	fi
done
chmod -R go+rX "$P/root" "$P/share-qemu"
"$P/root/usr/bin/qemu-system-x86_64" --version | head -n1 >&2
printf '%s\n%s\n' "$want" "$ver" >"$stamp"
