package supervisor

import (
	"github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/internal/host/ovmfvars"
	"github.com/vmsup/vmsup/internal/net/netmanage"
	"github.com/vmsup/vmsup/internal/net/nicfilter"
	"github.com/vmsup/vmsup/internal/observe/iohealth"
	"github.com/vmsup/vmsup/internal/observe/stats"
	"github.com/vmsup/vmsup/internal/ops/diskops"
	"github.com/vmsup/vmsup/internal/ops/plan"
	"github.com/vmsup/vmsup/internal/vm/backupchain"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
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
type PendingChanges = vmstore.Pending

// SnapshotTree is a VM's snapshots and the layers of its disks.
type SnapshotTree = snapshottree.Tree

// SnapshotInfo is one snapshot of a SnapshotTree.
type SnapshotInfo = snapshottree.Snapshot

// SnapshotImage is one image of a snapshot.
type SnapshotImage = snapshottree.Image

// SnapshotDisk is a disk as a snapshot plan sees it.
type SnapshotDisk = snapshottree.Disk

// SnapshotLayer is one layer of a disk's chain.
type SnapshotLayer = snapshottree.Layer

// SnapshotMerge is one merge a snapshot removal does.
type SnapshotMerge = snapshottree.Merge

// BackupDiskPoint is one disk of a backup point.
type BackupDiskPoint = backupchain.DiskPoint

// CloneFields is what a clone made (CloneResult embeds it).
type CloneFields = diskops.Clone

// Figures of one VM (VMStats).
type (
	CPUStats    = stats.CPU
	MemoryStats = stats.Memory
	DiskStats   = stats.Disk
	NICStats    = stats.NIC
)

// Parts of HostCaps.
type (
	HostCapsKey  = caps.Key
	HostQEMU     = caps.QEMU
	HostCPUModel = caps.CPUModel
	HostKVM      = caps.KVM
	HostCPUMode  = caps.CPUMode
	HostFacts    = caps.Facts
	HostResolved = caps.Resolved
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
