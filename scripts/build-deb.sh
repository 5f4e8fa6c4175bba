#!/usr/bin/env bash
# build-deb.sh [OUTDIR] builds vmsup's Debian package offline with dpkg-deb from a staged
# tree, into OUTDIR (default bin/) as vmsup_VERSION_amd64.deb, and prints its path.
# Contents: /usr/bin/vmsup; man pages (vmsup gen-man); bash, zsh and fish completions;
# the units vmsup enable, metrics --install and api install write, in /lib/systemd/system
# and not enabled (vmsup gen-units: the same renderers); sysusers.d (the shared QEMU user)
# and tmpfiles.d (the state root); maintainer scripts from packaging/deb/ that never stop
# a VM. VERSION is 0.0~gitYYYYMMDDhhmmss.REV from the commit (+dirty for a modified tree),
# or $VMSUP_DEB_VERSION.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$(mkdir -p "${1:-$REPO/bin}" && cd "${1:-$REPO/bin}" && pwd)
export PATH=$PATH:/usr/local/go/bin
log() { echo "build-deb: $*" >&2; }
die() {
	log "error: $*"
	exit 1
}
for t in go dpkg-deb gzip; do command -v "$t" >/dev/null || die "$t not found (Go: the version in go.mod; dpkg-deb, gzip: Debian's dpkg, gzip)"; done

cd "$REPO"
if rev=$(git -c safe.directory='*' log -1 --format='%cd.%h' --date=format-local:%Y%m%d%H%M%S 2>/dev/null); then
	git -c safe.directory='*' diff --quiet HEAD 2>/dev/null || rev+=+dirty
else
	rev=$(date -u +%Y%m%d%H%M%S).nogit
fi
VERSION=${VMSUP_DEB_VERSION:-0.0~git$rev}
ARCH=amd64
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/vmsup-deb.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
R=$STAGE/root
mkdir -p "$R/DEBIAN" "$R/usr/bin" "$R/usr/share/man/man1" "$R/lib/systemd/system" \
	"$R/usr/share/bash-completion/completions" "$R/usr/share/zsh/vendor-completions" \
	"$R/usr/share/fish/vendor_completions.d" "$R/usr/lib/sysusers.d" "$R/usr/lib/tmpfiles.d" \
	"$R/usr/share/doc/vmsup"

log "go build (version $VERSION)"
CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w -X main.buildVersion=$VERSION" \
	-o "$R/usr/bin/vmsup" ./cmd/vmsup
BIN=$R/usr/bin/vmsup
"$BIN" gen-man "$R/usr/share/man/man1"
gzip -9n "$R"/usr/share/man/man1/*.1
"$BIN" completion bash >"$R/usr/share/bash-completion/completions/vmsup"
"$BIN" completion zsh >"$R/usr/share/zsh/vendor-completions/_vmsup"
"$BIN" completion fish >"$R/usr/share/fish/vendor_completions.d/vmsup.fish"
# The defaults a packaged vmsup runs with: /usr/bin/vmsup, /var/lib/vmsup, Debian's QEMU.
env -u VMSUP_ROOT -u VMSUP_QEMU -u VMSUP_SYSTEMD_BUS -u VMSUP_IMAGE_DIRS -u VMSUP_ALLOW_PATHS \
	-u VMSUP_BLOCK_DIRS -u VMSUP_CONFIG_DIRS -u VMSUP_UNIT_DIR -u VMSUP_RUN_DIR -u VMSUP_QEMU_USER \
	"$BIN" gen-units --self /usr/bin/vmsup "$R/lib/systemd/system" >/dev/null
install -m 644 packaging/deb/vmsup.sysusers "$R/usr/lib/sysusers.d/vmsup.conf"
install -m 644 packaging/deb/vmsup.tmpfiles "$R/usr/lib/tmpfiles.d/vmsup.conf"
install -m 755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm "$R/DEBIAN/"
install -m 644 README.md "$R/usr/share/doc/vmsup/README.md"
gzip -9n "$R/usr/share/doc/vmsup/README.md"

SIZE=$(du -sk --exclude=DEBIAN "$R" | cut -f1)
MAINT=$(git -c safe.directory='*' log -1 --format='%an <%ae>' 2>/dev/null || echo 'vmsup maintainers <root@localhost>')
cat >"$R/DEBIAN/control" <<CTRL
Package: vmsup
Version: $VERSION
Architecture: $ARCH
Maintainer: $MAINT
Installed-Size: $SIZE
Depends: qemu-system-x86 (>= 1:7.2), qemu-utils (>= 1:7.2), systemd (>= 252), dbus
Recommends: apparmor, qemu-block-extra, ovmf, dnsmasq-base, nftables, iproute2
Suggests: apparmor-utils, openvswitch-switch, containernetworking-plugins, swtpm, swtpm-tools, qemu-guest-agent
Section: admin
Priority: optional
Homepage: https://github.com/vmsup/vmsup
Description: QEMU supervisor: VMs from TOML files as systemd units, no daemon
 vmsup turns a TOML file into a qemu-system-x86_64 command line, runs each VM
 as a transient systemd unit (vmsup-NAME.service) confined by its own
 AppArmor profile and systemd sandbox, and controls it over QMP.
 .
 Removing this package never stops running VMs.
CTRL
(cd "$R" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$R/DEBIAN/md5sums"
DEB=$OUT/vmsup_${VERSION}_$ARCH.deb
dpkg-deb --root-owner-group -Zxz --build "$R" "$DEB" >/dev/null
log "built $DEB ($(du -h "$DEB" | cut -f1))"
echo "$DEB"
