#!/usr/bin/env bash
# build-guest.sh [OUTDIR] builds the tiny test guest that vmsup's tests boot:
#   OUTDIR/vmlinux            uncompressed Debian kernel (boots via PVH with -kernel)
#   OUTDIR/vmlinuz            the same kernel as Debian ships it: an EFI binary (UEFI boots)
#   OUTDIR/initramfs.cpio.gz  busybox + qemu-ga + virtio modules + vmsup-nettool, /init described below
# OUTDIR defaults to ${VMSUP_GUEST_DIR:-/var/cache/vmsup/guest}. Downloaded .debs are kept in
# OUTDIR/debs. A build whose stamp (sha256 of this script and of vmsup-nettool's sources,
# internal/dev/testenv/nettool: a DHCPv6 client and hostile IPv6 frames, built with go) matches
# is reused at once.
# Concurrent runs serialize on OUTDIR/.lock; results are renamed into place, so an
# interrupted build never leaves a half-written file behind.
#
# Guest /init: mounts proc/sys/devtmpfs, loads the modules, starts acpid (ACPI power button
# -> poweroff -f) and qemu-ga (if a port named org.qemu.guest_agent.0 exists), prints
# "VMSUP-GUEST-READY", then acts on kernel command-line words:
#   vmsup.counter          print "VMSUP-COUNTER <n> <n>" every 0.2 s (background; the number
#                          twice, so a line other console output cut into reads as no value)
#   vmsup.ip=ADDR/PREFIX   static address on eth0 (vmsup.gw=ADDR adds a default route)
#   vmsup.dhcp             udhcpc on eth0
#   vmsup.dhcp6            a DHCPv6 client on eth0 (vmsup-nettool dhcp6; background)
#   vmsup.ipv6             wait for a global IPv6 address on eth0 (SLAAC or DHCPv6; background),
#                          print "VMSUP-NET6-READY eth0 <addr>"
#   vmsup.online           keep onlining hot-plugged CPUs and memory blocks (background)
#   vmsup.poweroff         power off right after the marker
# Network words print "VMSUP-NET-READY eth0 <addr>" when configured. Finally it prints
# "VMSUP-SHELL-READY" and runs a respawning interactive shell on the console.
set -euo pipefail

OUT=${1:-${VMSUP_GUEST_DIR:-/var/cache/vmsup/guest}}
SELF=$(readlink -f "${BASH_SOURCE[0]}")
NETTOOL=$(dirname "$SELF")/../internal/dev/testenv/nettool
STAMP=$(cat "$SELF" "$NETTOOL"/*.go | sha256sum | cut -d' ' -f1)

fresh() {
	[[ -f $OUT/vmlinux && -f $OUT/vmlinuz && -f $OUT/initramfs.cpio.gz && -f $OUT/stamp ]] &&
		[[ $(cat "$OUT/stamp") == "$STAMP" ]]
}
fresh && exit 0

log() { echo "build-guest: $*" >&2; }
die() { log "error: $*"; exit 1; }

mkdir -p "$OUT/debs"
exec 9>"$OUT/.lock"
flock 9
fresh && exit 0 # another run built it while we waited
t0=$(date +%s.%N)
rm -rf "$OUT"/.build.* "$OUT"/debs/.dl.* # left by killed runs; we hold the lock
WORK= dl= xzpid=
cleanup() {
	if [[ -n $xzpid ]]; then kill "$xzpid" 2>/dev/null || true; fi
	rm -rf ${WORK:+"$WORK"} ${dl:+"$dl"}
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# --- host packages ---------------------------------------------------------------------
HOST_PKGS=(busybox-static qemu-guest-agent xz-utils)
missing=()
for p in "${HOST_PKGS[@]}"; do
	st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
	[[ $st == 'install ok installed' ]] || missing+=("$p")
done
if ((${#missing[@]})); then
	log "installing ${missing[*]}"
	made_policy=
	if [[ ! -e /usr/sbin/policy-rc.d ]]; then # never start daemons from package scripts
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
		made_policy=1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
		{ apt-get update >&2 && apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
	if [[ -n $made_policy ]]; then rm -f /usr/sbin/policy-rc.d; fi
fi
BUSYBOX=/bin/busybox
QGA=/usr/sbin/qemu-ga
[[ -x $BUSYBOX && -x $QGA ]] || die "busybox-static or qemu-guest-agent not installed"
bbldd=$(ldd "$BUSYBOX" 2>&1 || true)
[[ $bbldd == *"not a dynamic executable"* ]] || die "$BUSYBOX is not static"

# --- kernel package --------------------------------------------------------------------
kernel_pkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
KPKG=$(kernel_pkg)
if [[ -z $KPKG ]]; then
	apt-get update >&2
	KPKG=$(kernel_pkg)
fi
[[ -n $KPKG ]] || die "cannot find the kernel package linux-image-amd64 depends on"
shopt -s nullglob
debs=("$OUT/debs/${KPKG}"_*.deb)
if ((${#debs[@]} == 0)); then
	log "downloading $KPKG"
	dl=$(mktemp -d "$OUT/debs/.dl.XXXXXX")
	chmod 755 "$dl"
	(cd "$dl" && apt-get download "$KPKG" >&2 2>/dev/null) ||
		(cd "$dl" && apt-get update >&2 && apt-get download "$KPKG" >&2)
	for f in "$dl"/*.deb; do mv "$f" "$OUT/debs/"; done
	rmdir "$dl"
	dl=
	debs=("$OUT/debs/${KPKG}"_*.deb)
fi
((${#debs[@]})) || die "download of $KPKG failed"
KDEB=${debs[-1]}

WORK=$(mktemp -d "$OUT/.build.XXXXXX")
ROOT=$WORK/root
mkdir -p "$WORK/k" "$ROOT"

# Modules in load order; dependencies found in each .ko's modinfo are loaded first.
REQUIRED=(virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk
	failover net_failover virtio_net virtio_console virtio_balloon button evdev)
# Optional modules: NAME loads always, NAME@ID only when a virtio device of that ID exists
# (blk 0x0002, scsi 0x0008, rng 0x0004, 9p 0x0009, vsock 0x0013, mem 0x0018); their dependencies inherit that.
# ext4 (which mounts ext2 too): a filesystem qemu-ga can freeze, for the snapshot tests.
OPTIONAL=(cdrom isofs pvpanic pvpanic_mmio i6300esb crc32c_generic@0x0002 ext4@0x0002
	scsi_common@0x0008 scsi_mod@0x0008 virtio_scsi@0x0008 crc64@0x0008 crc64_rocksoft@0x0008
	crct10dif_common@0x0008 crc_t10dif@0x0008 t10_pi@0x0008 sd_mod@0x0008 sr_mod@0x0008
	virtio_rng@0x0004 virtio_mem@0x0018 vsock@0x0013 vmw_vsock_virtio_transport_common@0x0013
	vmw_vsock_virtio_transport@0x0013 netfs@0x0009 fscache@0x0009 9pnet@0x0009 9pnet_virtio@0x0009 9p@0x0009)

# One pass over the package extracts the kernel and the modules by name; a dependency not
# listed above costs another pass. Module names use "_", file names "-" or "_".
pattern() { echo "./lib/modules/*/kernel/*/${1//_/[-_]}.ko"; }
extract() { dpkg-deb --fsys-tarfile "$KDEB" | tar -x -C "$WORK/k" --wildcards "$@" 2>/dev/null || true; }
declare -A KO
index() {
	local f n
	while read -r f; do
		n=${f##*/}
		n=${n%.ko}
		KO[${n//-/_}]=$f
	done < <(find "$WORK/k/lib/modules" -name '*.ko' 2>/dev/null)
}
pats=()
for m in "${REQUIRED[@]}" "${OPTIONAL[@]}"; do pats+=("$(pattern "${m%@*}")"); done
extract './boot/vmlinuz-*' "${pats[@]}"
index
for m in "${REQUIRED[@]}"; do [[ -n ${KO[$m]:-} ]] || die "module $m not in $KDEB"; done

deps_of() { tr '\0' '\n' <"${KO[$1]}" | sed -n 's/^depends=//p' | tr ',-' ' _'; }
ORDER=() # "NAME WHEN" lines, dependencies first
declare -A SEEN
visit() {
	local m=$1 when=$2 d
	if [[ -n ${SEEN[$m]:-} ]]; then return 0; fi
	SEEN[$m]=1
	if [[ -z ${KO[$m]:-} ]]; then
		log "extra pass for module $m"
		extract "$(pattern "$m")"
		index
		[[ -n ${KO[$m]:-} ]] || die "module $m (a dependency) not in $KDEB"
	fi
	for d in $(deps_of "$m"); do visit "$d" "$when"; done
	ORDER+=("$m $when")
}
for m in "${REQUIRED[@]}"; do visit "$m" required; done
for m in "${OPTIONAL[@]}"; do
	when=always
	[[ $m == *@* ]] && when=${m#*@}
	if [[ -n ${KO[${m%@*}]:-} ]]; then visit "${m%@*}" "$when"; fi
done

# Debian signs its modules; checking the signature costs ~10 ms per module under TCG.
# Unsigned modules still load (the kernel only taints itself).
strip_sig() {
	local f=$1 n
	[[ $(tail -c 28 "$f" | head -c 27) == '~Module signature appended~' ]] || return 0
	n=$(tail -c 32 "$f" | head -c 4 | od -An -tu4 --endian=big | tr -d ' ')
	truncate -s $(($(stat -c %s "$f") - 28 - 12 - n)) "$f"
}

# --- vmlinux: the xz stream inside vmlinuz ---------------------------------------------
vmlinuz=("$WORK"/k/boot/vmlinuz-*)
((${#vmlinuz[@]} == 1)) || die "expected one vmlinuz in $KDEB"
off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "${vmlinuz[0]}" | head -n1 | cut -d: -f1)
[[ -n $off ]] || die "no xz stream in ${vmlinuz[0]}"
# xz exits 1 on the bytes after the stream; the output is complete all the same.
# It runs while the initramfs is put together.
{ tail -c +$((off + 1)) "${vmlinuz[0]}" | xz -dc >"$WORK/vmlinux" 2>/dev/null || true; } &
xzpid=$!

# --- initramfs tree --------------------------------------------------------------------
mkdir -p "$ROOT"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,run,tmp,root,etc/acpi/PWRF,lib/modules,var/log,mnt}
ln -s ../run "$ROOT/var/run"
cp "$BUSYBOX" "$ROOT/bin/busybox"
for a in $("$BUSYBOX" --list-full); do
	[[ -e $ROOT/$a || -L $ROOT/$a ]] || ln -s /bin/busybox "$ROOT/$a"
done
mknod -m 600 "$ROOT/dev/console" c 5 1 2>/dev/null || true
for e in "${ORDER[@]}"; do
	m=${e% *}
	cp "${KO[$m]}" "$ROOT/lib/modules/$m.ko"
	strip_sig "$ROOT/lib/modules/$m.ko"
done
printf '%s\n' "${ORDER[@]}" >"$ROOT/etc/modules.order"

# vmsup-nettool: static, standard library only (so its sources are all the stamp needs).
GO=$(command -v go || echo /usr/local/go/bin/go)
[[ -x $GO ]] || die "go not found: it builds vmsup-nettool ($NETTOOL)"
(cd "$NETTOOL" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags='-s -w' -o "$ROOT/usr/bin/vmsup-nettool" .) >&2 ||
	die "building vmsup-nettool failed"

# qemu-ga with the shared libraries it needs, at the paths ldd reports.
cp "$QGA" "$ROOT/usr/sbin/qemu-ga"
for lib in $(ldd "$QGA" | grep -o '/[^ ]*'); do
	mkdir -p "$ROOT$(dirname "$lib")"
	cp -L "$lib" "$ROOT$lib"
done
mkdir -p "$ROOT/etc/qemu"

rm -f "$ROOT/sbin/shutdown"
cat >"$ROOT/sbin/shutdown" <<'EOF'
#!/bin/sh
# qemu-ga's guest-shutdown runs "shutdown -h -P +0 ..." or "shutdown -r +0 ...":
# busybox has no shutdown.
case " $* " in *" -r "*) sync; reboot -f ;; esac
sync; poweroff -f
EOF
cat >"$ROOT/etc/acpi/PWRF/00000080" <<'EOF'
#!/bin/sh
sync; poweroff -f
EOF
cat >"$ROOT/etc/udhcpc.script" <<'EOF'
#!/bin/sh
case "$1" in
bound|renew)
	ip -4 addr flush dev "$interface"
	ip addr add "$ip/${mask:-24}" dev "$interface"
	for r in $router; do ip route replace default via "$r" dev "$interface"; break; done
	: >/etc/resolv.conf; for d in $dns; do echo "nameserver $d" >>/etc/resolv.conf; done
	echo "VMSUP-NET-READY $interface $ip/${mask:-24}" >/dev/console ;;
deconfig) ip -4 addr flush dev "$interface"; ip link set "$interface" up ;;
esac
EOF
echo 'root:x:0:0:root:/root:/bin/sh' >"$ROOT/etc/passwd"
echo 'root:x:0:' >"$ROOT/etc/group"
printf 'ID=vmsup-guest\nNAME="vmsup test guest"\nVERSION_ID=%s\n' "${KPKG#linux-image-}" >"$ROOT/etc/os-release"

cat >"$ROOT/init" <<'EOF'
#!/bin/sh
export PATH=/sbin:/bin:/usr/sbin:/usr/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
hostname vmsup-guest
ip link set lo up

devs= # virtio device IDs, read once virtio_pci has probed
while read -r m when; do
	case "$when" in
	required | always) ;;
	*)
		[ -n "$devs" ] || devs=" $(echo $(cat /sys/bus/virtio/devices/*/device 2>/dev/null)) "
		case "$devs" in *" $when "*) ;; *) continue ;; esac ;;
	esac
	insmod "/lib/modules/$m.ko" 2>/dev/null || [ "$when" != required ] || echo "vmsup: insmod $m failed"
done </etc/modules.order

acpid -c /etc/acpi -l /run/acpid.log
# acpid opens the input devices only after it daemonized: wait until it has,
# or a power-button press right after the marker below is lost.
for i in $(seq 60); do
	p=$(pidof acpid) && ls -l "/proc/$p/fd" 2>/dev/null | grep -q /dev/input/event && break
	sleep 0.05
done

start_qga() {
	for i in $(seq 100); do
		for n in /sys/class/virtio-ports/*/name; do
			[ -f "$n" ] && [ "$(cat "$n")" = org.qemu.guest_agent.0 ] || continue
			p=${n%/name}
			qemu-ga -d -m virtio-serial -p "/dev/${p##*/}" -f /run/qemu-ga.pid
			return
		done
		sleep 0.05
	done
	echo "vmsup: no org.qemu.guest_agent.0 port, qemu-ga not started"
}
# Ports appear asynchronously after virtio_console binds: wait only if a device exists.
[ -n "$(ls /sys/bus/virtio/drivers/virtio_console 2>/dev/null | grep virtio)" ] && start_qga &

echo VMSUP-GUEST-READY

for w in $(cat /proc/cmdline); do
	case "$w" in
	vmsup.counter)
		(n=0; while :; do echo "VMSUP-COUNTER $n $n"; n=$((n + 1)); sleep 0.2; done) & ;;
	vmsup.ip=*)
		ip link set eth0 up && ip addr add "${w#vmsup.ip=}" dev eth0 &&
			echo "VMSUP-NET-READY eth0 ${w#vmsup.ip=}" ;;
	vmsup.gw=*)
		ip route replace default via "${w#vmsup.gw=}" ;;
	vmsup.dhcp)
		ip link set eth0 up && (udhcpc -i eth0 -s /etc/udhcpc.script -q -T 1 >/dev/null 2>&1 &) ;;
	vmsup.dhcp6)
		ip link set eth0 up && (vmsup-nettool dhcp6 eth0 >/run/dhcp6.log 2>&1 &) ;;
	vmsup.ipv6)
		ip link set eth0 up && (for i in $(seq 600); do
			a=$(ip -6 -o addr show dev eth0 scope global | grep -v tentative | awk '{print $4; exit}')
			[ -n "$a" ] && { echo "VMSUP-NET6-READY eth0 $a"; break; }
			sleep 0.1
		done &) ;;
	vmsup.online)
		(while :; do
			for f in /sys/devices/system/cpu/cpu*/online /sys/devices/system/memory/memory*/online; do
				[ "$(cat "$f" 2>/dev/null)" = 0 ] && echo 1 >"$f" 2>/dev/null
			done
			sleep 0.5
		done) & ;;
	vmsup.poweroff)
		sync; poweroff -f ;;
	esac
done

echo VMSUP-SHELL-READY
export PS1='vmsup-guest# '
while :; do setsid cttyhack sh; sleep 0.2; done
EOF
chmod 755 "$ROOT/init" "$ROOT/sbin/shutdown" "$ROOT/etc/acpi/PWRF/00000080" "$ROOT/etc/udhcpc.script"

(cd "$ROOT" && find . | LC_ALL=C sort | "$BUSYBOX" cpio -o -H newc 2>/dev/null) | gzip -6 >"$WORK/initramfs.cpio.gz"
wait "$xzpid"
[[ $(head -c4 "$WORK/vmlinux" | od -An -c | tr -d ' ') == '177ELF' ]] || die "vmlinux is not an ELF file"
echo "$STAMP" >"$WORK/stamp"

# Publish: drop the stamp first so nobody takes a half-published pair as fresh.
rm -f "$OUT/stamp"
mv -f "$WORK/vmlinux" "$OUT/vmlinux"
mv -f "${vmlinuz[0]}" "$OUT/vmlinuz"
mv -f "$WORK/initramfs.cpio.gz" "$OUT/initramfs.cpio.gz"
mv -f "$WORK/stamp" "$OUT/stamp"
log "built $OUT (kernel $KPKG, $(du -h "$OUT/initramfs.cpio.gz" | cut -f1) initramfs) in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
