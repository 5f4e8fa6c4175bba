package qemuargs

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/vmsup/vmsup/spec"
)

// OverlayBlockdev is a format node added live with no backing opened
// ("backing": null), as blockdev-snapshot requires of its overlay: the
// snapshot itself links it onto the disk's node.
type OverlayBlockdev struct {
	Blockdev
	Backing *string `json:"backing"` // always null
}

// OverlayNodeName is the node-name of the format node of the overlay in
// file; OverlayFileNodeName that of its protocol node. Derived from the
// path, so that a later command (or recovery) finds the nodes again.
func OverlayNodeName(file string) string     { return "ovl-" + pathHash(file) }
func OverlayFileNodeName(file string) string { return "ovf-" + pathHash(file) }

func pathHash(file string) string {
	h := sha256.Sum256([]byte(file))
	return hex.EncodeToString(h[:8])
}

// Overlay returns the two nodes of a qcow2 overlay for disk d in file
// (an external snapshot): the protocol node, then the format node, with
// the disk's cache, aio and discard settings.
func Overlay(d spec.Disk, file string) (Blockdev, OverlayBlockdev) {
	cm := cacheModes[d.Cache]
	discard := ""
	if d.Discard {
		discard = "unmap"
	}
	proto := Blockdev{Driver: "file", NodeName: OverlayFileNodeName(file), Filename: file, AIO: d.AIO,
		Cache: &BlockdevCache{Direct: cm.cache.Direct, NoFlush: cm.cache.NoFlush}, Discard: discard}
	format := OverlayBlockdev{Blockdev: Blockdev{Driver: "qcow2", NodeName: OverlayNodeName(file), File: proto.NodeName,
		Cache: &BlockdevCache{Direct: cm.cache.Direct, NoFlush: cm.cache.NoFlush}, Discard: discard}}
	return proto, format
}
