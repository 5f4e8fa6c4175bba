#!/usr/bin/env bash
# build-real-host.sh [OUTDIR] builds the Debian 12 host that the real-host test
# (supervisor/realhosttest) boots as a VM and installs vmsup's own package into, from
# Debian's packages with debootstrap:
#   OUTDIR/disk.qcow2   ext4 on the whole disk (no partition table, no bootloader): systemd as
#                       PID 1 (cgroup v2 only, Debian 12's default), AppArmor (apparmor,
#                       apparmor-utils), qemu-system-x86 + qemu-utils, qemu-guest-agent (how the
#                       test drives it), dbus; no vmsup (the test installs the .deb)
#   OUTDIR/vmlinuz      the image's own kernel as Debian ships it (bzImage)
#   OUTDIR/vmlinux      the same kernel uncompressed (PVH entry: no in-guest decompression)
#   OUTDIR/initrd.img   the image's own initramfs (virtio and ext4 are modules)
#   OUTDIR/info         package versions, build time and sizes
# Boot it directly: -kernel vmlinux -initrd initrd.img,
# "root=/dev/vda rw console=ttyS0 apparmor=1 security=apparmor".
# The host prints "VMSUP-REALHOST-BOOTED <boot id>" on ttyS0 at every boot once
# multi-user.target is reached; its journal is persistent (/var/log/journal).
# OUTDIR defaults to ${VMSUP_REALHOST_DIR:-/var/cache/vmsup/realhost}. A build whose stamp
# (sha256 of this script, which holds every input) matches is reused at once; downloaded
# .debs are kept in OUTDIR/debs. Concurrent runs serialize on OUTDIR/.lock; results are
# renamed into place. A failed build leaves its reason in OUTDIR/error.
set -euo pipefail

OUT=${1:-${VMSUP_REALHOST_DIR:-/var/cache/vmsup/realhost}}
SELF=$(readlink -f "${BASH_SOURCE[0]}")
STAMP=$(sha256sum "$SELF" | cut -d' ' -f1)
SUITE=bookworm
MIRROR=${VMSUP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SIZE=4G # the disk the host VM sees; the qcow2 holds only what is written

fresh() {
	[[ -f $OUT/disk.qcow2 && -f $OUT/vmlinux && -f $OUT/vmlinuz && -f $OUT/initrd.img && -f $OUT/stamp ]] &&
		[[ $(cat "$OUT/stamp") == "$STAMP" ]]
}
fresh && exit 0

log() { echo "build-real-host: $*" >&2; }
die() {
	log "error: $*"
	echo "$*" >"$OUT/error"
	exit 1
}

mkdir -p "$OUT/debs"
exec 9>"$OUT/.lock"
flock 9
fresh && exit 0 # another run built it while we waited
t0=$(date +%s)
rm -rf "$OUT"/.build.* # left by killed runs; we hold the lock
rm -f "$OUT/error"
WORK=
cleanup() { if [[ -n $WORK ]]; then rm -rf --one-file-system "$WORK"; fi; }
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# --- host packages ---------------------------------------------------------------------
HOST_PKGS=(debootstrap e2fsprogs qemu-utils xz-utils)
missing=()
for p in "${HOST_PKGS[@]}"; do
	st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
	[[ $st == 'install ok installed' ]] || missing+=("$p")
done
if ((${#missing[@]})); then
	log "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${missing[@]}" >&2 ||
		{ apt-get update -q >&2 && apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${missing[@]}" >&2; } ||
		die "cannot install ${missing[*]}"
fi

# --- the root filesystem ---------------------------------------------------------------
# debootstrap does not resolve virtual packages: name what QEMU's direct kernel boot needs
# (seabios, its option ROMs) and the agent's and apparmor's dependencies outright.
PKGS=systemd-sysv,udev,dbus,qemu-guest-agent,iproute2,netbase,kmod,procps,linux-image-amd64,initramfs-tools,
PKGS+=e2fsprogs,apparmor,apparmor-utils,qemu-system-x86,qemu-utils,qemu-system-data,seabios,ipxe-qemu
WORK=$(mktemp -d "$OUT/.build.XXXXXX")
ROOT=$WORK/root
mkdir -p "$ROOT/etc/dpkg/dpkg.cfg.d" "$ROOT/etc/initramfs-tools/conf.d"
# What a VM without sound, graphics, wireless or physical NICs never loads, and the
# documentation, is never unpacked (the initramfs is smaller too).
{
	for d in share/doc share/man share/info share/locale; do echo "path-exclude=/usr/$d/*"; done
	echo "path-include=/usr/share/doc/*/copyright"
	for d in sound drivers/gpu drivers/media drivers/net/wireless drivers/infiniband drivers/bluetooth \
		drivers/staging drivers/isdn drivers/iio drivers/nfc drivers/mtd drivers/thunderbolt drivers/hwmon \
		drivers/net/ethernet drivers/net/can drivers/usb/serial drivers/usb/gadget drivers/scsi/qla2xxx \
		drivers/scsi/lpfc drivers/scsi/mpt3sas drivers/scsi/bfa drivers/scsi/be2iscsi drivers/md/bcache \
		net/wireless net/mac80211 net/bluetooth fs/ocfs2 fs/gfs2 fs/xfs fs/btrfs fs/f2fs fs/nfs fs/nfsd fs/smb \
		fs/ntfs3 fs/cifs; do
		echo "path-exclude=/lib/modules/*/kernel/$d/*"
	done
	echo "path-include=/lib/modules/*/kernel/drivers/net/ethernet/intel/*" # e1000e NICs
} >"$ROOT/etc/dpkg/dpkg.cfg.d/90-vmsup-small"
# The initramfs holds only what mounts the root, virtio-blk and ext4 with their dependencies
# (in modules.d: /etc/initramfs-tools/modules is a conffile); udev loads the rest from the root.
echo 'MODULES=list' >"$ROOT/etc/initramfs-tools/conf.d/vmsup"
mkdir -p "$ROOT/usr/share/initramfs-tools/modules.d"
printf '%s\n' virtio_pci virtio_blk ext4 crc32c_generic >"$ROOT/usr/share/initramfs-tools/modules.d/vmsup"
log "debootstrap $SUITE from $MIRROR"
# In a mount namespace of its own: the proc and sys debootstrap mounts in the target
# can never outlive it, whatever kills it.
unshare -m --propagation private debootstrap --variant=minbase --foreign --include="$PKGS" \
	--cache-dir="$OUT/debs" "$SUITE" "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
	die "debootstrap (first stage) failed: $(tail -n 5 "$WORK/debootstrap.log")"
t1=$(date +%s)
unshare -m --propagation private chroot "$ROOT" /debootstrap/debootstrap --second-stage >>"$WORK/debootstrap.log" 2>&1 ||
	die "debootstrap (second stage) failed: $(tail -n 5 "$ROOT/debootstrap/debootstrap.log" "$WORK/debootstrap.log" 2>/dev/null)"
t2=$(date +%s)

# --- configuration -------------------------------------------------------------------
echo '/dev/vda / ext4 errors=remount-ro 0 1' >"$ROOT/etc/fstab"
: >"$ROOT/etc/machine-id" # made at the first boot: every VM has its own
mkdir -p "$ROOT/var/log/journal" # persistent: a test reads the previous boot's
echo vmsup-host >"$ROOT/etc/hostname"
cat >"$ROOT/etc/systemd/system/vmsup-booted.service" <<'EOF'
[Unit]
Description=Tell the console that the boot is done (vmsup's real-host test)
After=multi-user.target vmsup.service

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo "VMSUP-REALHOST-BOOTED $(cat /proc/sys/kernel/random/boot_id)" >/dev/ttyS0'

[Install]
WantedBy=multi-user.target
EOF
ln -sf /etc/systemd/system/vmsup-booted.service "$ROOT/etc/systemd/system/multi-user.target.wants/vmsup-booted.service"
# Timers that would compete with the tests for the emulated CPU.
for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer; do
	ln -sf /dev/null "$ROOT/etc/systemd/system/$u"
done
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/cache/apt/archives/*.deb "$ROOT/debootstrap"
rm -f "$ROOT/etc/resolv.conf"

KVER=$(basename "$(ls -d "$ROOT"/lib/modules/*)")
[[ -f $ROOT/boot/vmlinuz-$KVER && -f $ROOT/boot/initrd.img-$KVER ]] || die "no kernel or initrd for $KVER in the image"
cp "$ROOT/boot/vmlinuz-$KVER" "$WORK/vmlinuz"
cp "$ROOT/boot/initrd.img-$KVER" "$WORK/initrd.img"
off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$WORK/vmlinuz" | head -n1 | cut -d: -f1)
[[ -n $off ]] || die "no xz stream in vmlinuz-$KVER"
# xz exits 1 on the bytes after the stream; the output is complete all the same.
tail -c +$((off + 1)) "$WORK/vmlinuz" | xz -dc >"$WORK/vmlinux" 2>/dev/null || true
[[ $(head -c4 "$WORK/vmlinux" | od -An -c | tr -d ' ') == '177ELF' ]] || die "vmlinux is not an ELF file"

# --- the disk ------------------------------------------------------------------------
used=$(du -sh --one-file-system "$ROOT" | cut -f1)
truncate -s "$SIZE" "$WORK/disk.raw"
mkfs.ext4 -q -L root -d "$ROOT" "$WORK/disk.raw" >&2 || die "mkfs.ext4 -d failed"
qemu-img convert -f raw -O qcow2 "$WORK/disk.raw" "$WORK/disk.qcow2" || die "qemu-img convert failed"
rm -f "$WORK/disk.raw"
versions=$(chroot "$ROOT" dpkg-query -W -f='${Package} ${Version}\n' linux-image-"$KVER" systemd apparmor \
	qemu-system-x86 qemu-guest-agent 2>/dev/null || true)
t3=$(date +%s)
{
	echo "kernel $KVER"
	echo "$versions"
	echo "packages $(chroot "$ROOT" dpkg-query -W | wc -l)"
	echo "rootfs $used; disk.qcow2 $(du -h "$WORK/disk.qcow2" | cut -f1) ($SIZE virtual); initrd $(du -h "$WORK/initrd.img" | cut -f1)"
	echo "build $((t3 - t0)) s: debootstrap download+unpack $((t1 - t0)) s, install $((t2 - t1)) s, image $((t3 - t2)) s"
} >"$WORK/info"
echo "$STAMP" >"$WORK/stamp"

# Publish: drop the stamp first so nobody takes a half-published set as fresh.
rm -f "$OUT/stamp"
for f in disk.qcow2 vmlinux vmlinuz initrd.img info stamp; do mv -f "$WORK/$f" "$OUT/$f"; done
log "built $OUT: $(tr '\n' ';' <"$OUT/info")"
