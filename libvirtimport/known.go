package libvirtimport

import "strings"

// knownPaths are the elements and attributes of a domain XML the
// conversion reads (carries over, or decides about with a line), in
// XML names: one line an element, then its attributes. "*/NAME" is the
// element NAME anywhere, "@*" every attribute. The structural check
// (walk.go) lists everything else. Keep it in step with the code that
// reads: a path here that no code reads is a setting lost in silence.
func knownPaths() map[string]bool {
	m := map[string]bool{}
	for _, line := range strings.Split(knownText+displayKnownText, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		el := f[0]
		if el == "." {
			el = ""
		} else {
			m[el] = true
		}
		for _, a := range f[1:] {
			m[joinKey(el, a)] = true
		}
	}
	return m
}

// knownText: the domain's own settings (convert.go, memory.go), then its
// devices (disks.go, nics.go, devices.go, guestdevs.go). Device addresses
// and aliases are placement: vmsup lays out its own (a line says so).
const knownText = `
. @type @id
name
uuid
title
description
genid
memory @unit
maxMemory @unit @slots
currentMemory @unit
vcpu @current @cpuset @placement
iothreads
iothreadids
iothreadids/iothread @id
cpu @mode @match @check @migratable
cpu/model @fallback
cpu/topology @sockets @dies @clusters @cores @threads
cpu/numa
cpu/numa/cell @id @cpus @memory @unit @memAccess
os @firmware
os/type @arch @machine
os/loader @readonly @type @secure @format
os/firmware
os/firmware/feature @enabled @name
os/nvram @template @format
os/kernel
os/initrd
os/cmdline
os/boot @dev
os/smbios @mode
features
features/acpi
features/apic
features/pae
features/vmcoreinfo @state
clock @offset
on_poweroff
on_reboot
on_crash
sysinfo @type
sysinfo/system
sysinfo/system/entry @name
sysinfo/oemStrings
sysinfo/oemStrings/entry
cputune
cputune/quota
cputune/period
cputune/vcpupin @vcpu @cpuset
cputune/emulatorpin @cpuset
memoryBacking
memoryBacking/hugepages
memoryBacking/hugepages/page @size @unit @nodeset
memoryBacking/source @type
memoryBacking/access @mode
launchSecurity @type @kernelHashes
launchSecurity/cbitpos
launchSecurity/reducedPhysBits
launchSecurity/policy
*/address @*
*/alias @name
devices
devices/emulator
devices/disk @type @device @snapshot
devices/disk/driver @name @type @cache @io @discard @iothread @error_policy @rerror_policy @queues @queue_size @event_idx
devices/disk/driver/iothreads
devices/disk/driver/iothreads/iothread @id
devices/disk/driver/iothreads/iothread/queue @id
devices/disk/source @file @dev @protocol @name @pool @volume @tls @index
devices/disk/source/host @name @port @transport
devices/disk/source/snapshot @name
devices/disk/source/config @file
devices/disk/source/auth @username
devices/disk/source/auth/secret @type @uuid @usage
devices/disk/source/initiator
devices/disk/source/initiator/iqn @name
devices/disk/auth @username
devices/disk/auth/secret @type @uuid @usage
devices/disk/target @dev @bus
devices/disk/readonly
devices/disk/serial
devices/disk/boot @order
devices/disk/iotune
devices/disk/iotune/total_bytes_sec
devices/disk/iotune/read_bytes_sec
devices/disk/iotune/write_bytes_sec
devices/disk/iotune/total_iops_sec
devices/disk/iotune/read_iops_sec
devices/disk/iotune/write_iops_sec
devices/disk/backingStore
devices/controller @type @index @model @ports @vectors
devices/controller/model @name
devices/controller/target @chassisNr @chassis @port @busNr @hotplug
devices/interface @type
devices/interface/source @bridge @network
devices/interface/mac @address
devices/interface/model @type
devices/interface/target @dev
devices/interface/mtu @size
devices/interface/driver @name @queues @txmode @rx_queue_size @tx_queue_size
devices/interface/tune
devices/interface/tune/sndbuf
devices/interface/link @state
devices/interface/rom @bar @enabled @file
devices/interface/virtualport @type
devices/interface/ip @address @family @prefix @peer
devices/interface/filterref @filter
devices/interface/filterref/parameter @name @value
devices/channel @type
devices/channel/source @mode @path
devices/channel/target @type @name @state
devices/rng @model
devices/rng/backend @model
devices/rng/rate @bytes @period
devices/memballoon @model
devices/watchdog @model @action
devices/panic @model
devices/serial @type
devices/serial/source @path
devices/serial/target @type @port
devices/serial/target/model @name
devices/console @type
devices/console/source @path
devices/console/target @type @port
devices/hostdev @mode @type @managed
devices/hostdev/driver @name
devices/hostdev/source
devices/hostdev/rom @bar @file @enabled
devices/tpm @model
devices/tpm/backend @type @version
devices/filesystem @type @accessmode
devices/filesystem/driver @type @queue
devices/filesystem/source @dir
devices/filesystem/target @dir
devices/filesystem/readonly
devices/vsock @model
devices/vsock/cid @auto @address
devices/memory @model @access @discard
devices/memory/target
devices/memory/target/size @unit
devices/memory/target/node
`
