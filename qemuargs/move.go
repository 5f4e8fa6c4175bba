package qemuargs

import (
	"fmt"

	"github.com/vmsup/vmsup/spec"
)

// A live disk move (blockdev-mirror) opens the disk's new image next to
// the one the device runs on, so its nodes cannot take the disk's usual
// names (DiskNodeName, DiskFileNodeName) while the source's still exist.
// They are named after the disk and the target instead, so that a later
// command (a detach, recovery) finds them again. The next boot opens the
// moved disk under the usual names.

// MoveNodeName is the node-name of the format node of disk's move target
// t; MoveFileNodeName that of its protocol node; MoveSecretID the id of
// the secret object an RBD or iSCSI target reads its key from.
func MoveNodeName(disk string, t spec.Disk) string     { return "mvt-" + pathHash(moveKey(disk, t)) }
func MoveFileNodeName(disk string, t spec.Disk) string { return "mvf-" + pathHash(moveKey(disk, t)) }
func MoveSecretID(disk string, t spec.Disk) string     { return "mvs-" + pathHash(moveKey(disk, t)) }

// moveKey identifies a target: the disk's name and where its data is.
func moveKey(disk string, t spec.Disk) string {
	switch t.Type {
	case spec.DiskRBD:
		return fmt.Sprintf("%s\x00rbd\x00%s\x00%s\x00%s", disk, t.Pool, t.Namespace, t.Image)
	case spec.DiskISCSI:
		return fmt.Sprintf("%s\x00iscsi\x00%s\x00%s\x00%d", disk, t.Portal, t.Target, t.LUN)
	}
	return disk + "\x00file\x00" + t.File
}

// MoveTarget returns what a move target t of disk t.Name puts into QEMU:
// its secret object (if it needs one), then its protocol and format
// nodes, built as Disk builds them at boot (cache, aio, discard, RBD and
// iSCSI options) under the names above. No devices: the disk's device
// stays and is pivoted onto the format node by the mirror.
func MoveTarget(t spec.Disk, h DiskHost) (DiskParts, error) {
	switch {
	case t.ReadOnly || t.IsCDROM():
		return DiskParts{}, &Error{Object: fmt.Sprintf("disk %q", t.Name), Field: "read_only", Msg: "a move target must be writable"}
	case t.Type == spec.DiskSeed || t.Type == spec.DiskISO:
		return DiskParts{}, &Error{Object: fmt.Sprintf("disk %q", t.Name), Field: "type", Msg: fmt.Sprintf("a disk cannot be moved to a %s", t.Type)}
	}
	p, err := Disk(t, h, "pci.0")
	if err != nil {
		return DiskParts{}, err
	}
	out := DiskParts{}
	for _, o := range p.Objects {
		if o.QOMType == "secret" {
			o.ID = MoveSecretID(t.Name, t)
			out.Objects = append(out.Objects, o)
		}
	}
	proto, format := p.Blockdevs[0], p.Blockdevs[1]
	proto.NodeName = MoveFileNodeName(t.Name, t)
	if proto.PasswordSecret != "" {
		proto.PasswordSecret = MoveSecretID(t.Name, t)
	}
	if proto.KeySecret != "" {
		proto.KeySecret = MoveSecretID(t.Name, t)
	}
	format.NodeName, format.File = MoveNodeName(t.Name, t), proto.NodeName
	out.Blockdevs = []Blockdev{proto, format}
	return out, nil
}
