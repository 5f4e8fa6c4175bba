#!/usr/bin/env bash
# import-goldens.sh regenerates testdata/import/*.xml: libvirt domain XMLs
# written by real tools, the input of vmsup import's golden tests (the
# tests read the stored files; they do not run libvirt). It installs
# virtinst, starts a private libvirtd (its own network and mount namespace,
# tmpfs state, a socket under a temporary directory: the host's libvirt is
# not touched), and keeps
#   vi-NAME.xml    `virt-install --print-xml 1` for an option set,
#   dump-NAME.xml  `virsh dumpxml` of a domain defined from one of those.
# Then: go test ./libvirtimport -update, and review the TOML diffs.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$PWD/testdata/import
command -v virt-install >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q virtinst
for b in libvirtd virtlogd virsh tini unshare qemu-img; do
	command -v "$b" >/dev/null || { echo "import-goldens: $b missing (scripts/install-bench-deps.sh installs libvirt)" >&2; exit 1; }
done
LV_DIR=$(mktemp -d /tmp/vmsup-import-goldens.XXXXXX)
trap 'rm -rf "$LV_DIR"' EXIT
mkdir -p "$LV_DIR/sock"
cat >"$LV_DIR/libvirtd.conf" <<CONF
unix_sock_dir = "$LV_DIR/sock"
unix_sock_rw_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:file:$LV_DIR/libvirtd.log"
CONF
export LV_DIR OUT
unshare --net --mount --propagation private -- tini -s -- bash -euo pipefail -c '
for d in /run/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt /var/lib/vmsup /srv; do
	mkdir -p "$d" 2>/dev/null || true
	mount -t tmpfs -o mode=0755 tmpfs "$d"
done
mkdir -p /var/log/libvirt/qemu /var/lib/libvirt/qemu /var/lib/vmsup/images /srv/iso /srv/boot /srv/share
ip link set lo up
virtlogd --pid-file "$LV_DIR/virtlogd.pid" &
libvirtd -f "$LV_DIR/libvirtd.conf" --pid-file "$LV_DIR/libvirtd.pid" &
trap "kill $! \$(cat \"\$LV_DIR/virtlogd.pid\" 2>/dev/null) 2>/dev/null; wait" EXIT
URI="qemu:///system?socket=$LV_DIR/sock/libvirt-sock"
for i in $(seq 100); do virsh -q -c "$URI" version >/dev/null 2>&1 && break; sleep 0.1; done
# Stand-ins for the files the option sets name (virt-install looks at them).
for f in root data scsi sata install iotune kvm pcvm uefi cpu; do qemu-img create -q -f qcow2 "/var/lib/vmsup/images/$f.qcow2" 1G; done
truncate -s 100M /srv/iso/debian-12.iso /srv/iso/tools.iso
touch /srv/boot/vmlinuz /srv/boot/initrd.img
mkdir -p /srv/dev && mknod /srv/dev/vg0-lv-web b 7 200 # a block device node, never opened
ip link add br0 type bridge
ip link add ovsbr0 type bridge
vi() { # vi NAME OPTIONS...: one virt-install option set
	local name=$1; shift
	virt-install --connect "$URI" --print-xml 1 --noautoconsole --name "$name" --osinfo detect=on,require=off "$@" >"$OUT/vi-$name.xml"
	echo "import-goldens: vi-$name.xml"
}
dump() { # dump NAME: virsh define of vi-NAME.xml, then dumpxml
	virsh -q -c "$URI" define "$OUT/vi-$1.xml" >/dev/null
	virsh -q -c "$URI" dumpxml "$1" >"$OUT/dump-$1.xml"
	virsh -q -c "$URI" undefine "$1" --nvram >/dev/null 2>&1 || virsh -q -c "$URI" undefine "$1" >/dev/null
	echo "import-goldens: dump-$1.xml"
}
IMG=/var/lib/vmsup/images
SEC=6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b
vi basic --memory 512 --vcpus 1 --import --disk $IMG/root.qcow2,bus=virtio --network bridge=br0 --graphics none --osinfo debian11
vi uefi --memory 1024 --vcpus 2 --boot uefi --import --disk $IMG/uefi.qcow2 --network bridge=br0 --osinfo debian11
vi kernel --memory 256 --import --boot kernel=/srv/boot/vmlinuz,initrd=/srv/boot/initrd.img,kernel_args="console=ttyS0 root=/dev/vda" --disk $IMG/root.qcow2 --network none --graphics none --osinfo linux2022
vi install --memory 2048 --vcpus 2 --cdrom /srv/iso/debian-12.iso --disk $IMG/install.qcow2 --network network=default --osinfo debian11
vi scsi --memory 512 --import --controller type=scsi,model=virtio-scsi --disk $IMG/scsi.qcow2,bus=scsi --disk $IMG/data.qcow2,bus=scsi,cache=none --network bridge=br0 --osinfo debian11
vi sata --memory 512 --import --disk $IMG/sata.qcow2,bus=sata --disk /srv/iso/tools.iso,device=cdrom,bus=sata --network bridge=br0 --osinfo debian11
vi block --memory 512 --import --disk type=block,source.dev=/srv/dev/vg0-lv-web,target.bus=virtio,driver.cache=none,driver.io=native --network bridge=br0 --osinfo debian11
vi rbd --memory 1024 --import --disk type=network,source.protocol=rbd,source.name=rbd/web-root,source.host0.name=127.0.0.1,source.host0.port=6789,target.bus=virtio --xml ./devices/disk[1]/auth/@username=admin --xml ./devices/disk[1]/auth/secret/@type=ceph --xml ./devices/disk[1]/auth/secret/@uuid=$SEC --network bridge=br0 --osinfo debian11
vi rbd-ns --memory 1024 --import --disk type=network,source.protocol=rbd,source.name=rbd/tenant/vol1,source.host0.name=127.0.0.1,source.host0.port=6789,target.bus=virtio --xml ./devices/disk[1]/source/config/@file=/etc/ceph/ceph.conf --disk type=network,readonly=on,source.protocol=rbd,source.name=rbd/golden-image,source.host0.name=127.0.0.1,target.bus=scsi --xml ./devices/disk[2]/source/snapshot/@name=release-1 --network bridge=br0 --osinfo debian11
vi iscsi --memory 1024 --import --disk type=network,source.protocol=iscsi,source.name=iqn.2026-01.test.vmsup:store/1,source.host0.name=127.0.0.1,source.host0.port=3260,target.bus=virtio --xml ./devices/disk[1]/source/initiator/iqn/@name=iqn.2026-01.test.vmsup:good --network bridge=br0 --osinfo debian11
vi lun --memory 1024 --import --disk $IMG/root.qcow2 --disk type=network,device=lun,source.protocol=iscsi,source.name=iqn.2026-01.test.vmsup:db/1,source.host0.name=127.0.0.1,target.bus=scsi --network bridge=br0 --osinfo debian11
vi nics --memory 512 --import --disk $IMG/root.qcow2 --network network=default --network bridge=br0,model=e1000,mac=52:54:00:aa:bb:cc --network type=user --network bridge=br0,driver.queues=4,mtu.size=9000 --osinfo debian11
vi ovs --memory 512 --import --disk $IMG/root.qcow2 --network bridge=ovsbr0,virtualport.type=openvswitch --osinfo debian11
vi identity --memory 512 --import --disk $IMG/root.qcow2 --uuid 2b9e6a3c-1f0d-4c5e-8a7b-6d5c4b3a2918 --sysinfo type=smbios,system.manufacturer=Acme,system.product=Widget,system.serial=SER-0042,system.family=web,oemStrings.entry0=asset=A-17,oemStrings.entry1=io.systemd.credential:firstboot.timezone=UTC --metadata title=Web,description="the web server" --network none --osinfo debian11
vi devices --memory 512 --import --disk $IMG/root.qcow2 --rng /dev/urandom --watchdog i6300esb,action=poweroff --panic default --memballoon virtio --features vmcoreinfo.state=on --channel unix,target.type=virtio,name=org.qemu.guest_agent.0 --events on_crash=restart --network none --osinfo debian11
vi cpu --memory 1024 --vcpus 2,maxvcpus=4 --cpu host-passthrough --cputune vcpupin0.vcpu=0,vcpupin0.cpuset=1 --import --disk $IMG/cpu.qcow2 --network none --osinfo debian11
vi pc --memory 512 --machine pc --import --disk $IMG/pcvm.qcow2,bus=ide --disk /srv/iso/tools.iso,device=cdrom,bus=ide --network bridge=br0,model=rtl8139 --osinfo debian11
vi unsupported --memory 512 --import --disk $IMG/root.qcow2 --tpm emulator --filesystem /srv/share,share --graphics spice --video qxl --sound ich9 --network bridge=br0 --osinfo debian11
vi iotune --memory 512 --import --disk $IMG/iotune.qcow2,cache=none,io=native,discard=unmap,serial=ROOT-1,boot.order=1,iotune.total_iops_sec=500,iotune.read_bytes_sec=52428800 --disk /srv/iso/tools.iso,device=cdrom,boot.order=2 --network bridge=br0 --osinfo debian11
vi kvm-name --memory 768 --vcpus 3 --import --disk $IMG/kvm.qcow2 --network bridge=br0 --osinfo debian11 --name "web server #1"
vi topology --memory 1024 --vcpus 4,sockets=2,cores=2,threads=1 --cputune vcpupin0.vcpu=0,vcpupin0.cpuset=0,vcpupin1.vcpu=1,vcpupin1.cpuset=1,vcpupin2.vcpu=2,vcpupin2.cpuset=0,vcpupin3.vcpu=3,vcpupin3.cpuset=1,emulatorpin.cpuset=0-1 --import --disk $IMG/cpu.qcow2 --network none --osinfo debian11
vi numa --memory 1024 --vcpus 4,sockets=2,cores=2,threads=1 --cpu host-passthrough,cell0.cpus=0-1,cell0.memory=524288,cell1.cpus=2-3,cell1.memory=524288 --import --disk $IMG/cpu.qcow2 --network none --osinfo debian11
for n in basic uefi install rbd iscsi identity devices cpu nics topology numa; do dump "$n"; done
'
ls "$OUT"/*.xml | wc -l
