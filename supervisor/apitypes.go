package supervisor

import (
	"github.com/vmsup/vmsup/internal/backup"
	"github.com/vmsup/vmsup/internal/diskops"
	"github.com/vmsup/vmsup/internal/hostcaps"
	"github.com/vmsup/vmsup/internal/iohealth"
	"github.com/vmsup/vmsup/internal/netmanage"
	"github.com/vmsup/vmsup/internal/nicfilter"
	"github.com/vmsup/vmsup/internal/ovmfvars"
	"github.com/vmsup/vmsup/internal/plan"
	"github.com/vmsup/vmsup/internal/snapshot"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/internal/vmstats"
)

// The types of the public API that live in internal packages, named here so
// a program using package supervisor can declare what it receives
// (TestPublicAPINamesItsTypes keeps the list whole).

// Change is one difference between a VM's file and what it runs (plan, apply).
type Change = plan.Change

// ChangeClass says how a change reaches the running VM.
type ChangeClass = plan.Class

// ChangeKind is what apply does for a live change.
type ChangeKind = plan.Kind

// How a change reaches the running VM, from the cheapest to the impossible.
const (
	ChangeLive       = plan.Live
	ChangeReboot     = plan.Reboot
	ChangeRestart    = plan.Restart
	ChangeImpossible = plan.Impossible
)

// PendingChanges is a file apply holds back for the guest's next reboot.
type PendingChanges = vmstate.Pending

// SnapshotTree is a VM's snapshots and the layers of its disks.
type SnapshotTree = snapshot.Tree

// SnapshotInfo is one snapshot of a SnapshotTree.
type SnapshotInfo = snapshot.Snapshot

// SnapshotImage is one image of a snapshot.
type SnapshotImage = snapshot.Image

// SnapshotDisk is a disk as a snapshot plan sees it.
type SnapshotDisk = snapshot.Disk

// SnapshotLayer is one layer of a disk's chain.
type SnapshotLayer = snapshot.Layer

// SnapshotMerge is one merge a snapshot removal does.
type SnapshotMerge = snapshot.Merge

// BackupDiskPoint is one disk of a backup point.
type BackupDiskPoint = backup.DiskPoint

// CloneFields is what a clone made (CloneResult embeds it).
type CloneFields = diskops.Clone

// Figures of one VM (VMStats).
type (
	CPUStats    = vmstats.CPU
	MemoryStats = vmstats.Memory
	DiskStats   = vmstats.Disk
	NICStats    = vmstats.NIC
)

// Parts of HostCaps.
type (
	HostCapsKey  = hostcaps.Key
	HostQEMU     = hostcaps.QEMU
	HostCPUModel = hostcaps.CPUModel
	HostKVM      = hostcaps.KVM
	HostCPUMode  = hostcaps.CPUMode
	HostFacts    = hostcaps.Facts
	HostResolved = hostcaps.Resolved
)

// Parts of SecureBootStatus.
type (
	VarStore     = ovmfvars.Store
	VarStoreCert = ovmfvars.Cert
)

// Managed networks (Networks) and a network NIC's filter counts (NICInfo).
type (
	NetworkManager    = netmanage.Manager
	Network           = netmanage.Network
	NetworkInfo       = netmanage.Info
	NetworkAttachment = netmanage.Attachment
	NetworkNICRef     = netmanage.NICRef
	NICFilterCounts   = nicfilter.Counts
)

// A VM's disk I/O health (DiskIO).
type (
	DiskIOSample = iohealth.Sample
	DiskIOHealth = iohealth.Disk
)
