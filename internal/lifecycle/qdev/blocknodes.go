package qdev

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
)

// The block nodes of a running QEMU: which node a device or an image file
// runs on, the chain a node is in, the parts vmsup named for a disk (as
// booted, or as a move target), and their removal. Shared by the disk
// operations (snapshots, backups, moves, exports) and the disk unplug.

// FindNode finds the format node QEMU has open on image file path: not
// its protocol node, nor a filter a block job put above it (commit_top,
// mirror_top, copy-before-write), which report the same file.
func FindNode(ctx context.Context, c *qmp.Conn, path string) (qmp.BlockNode, error) {
	nodes, err := NamedNodes(ctx, c)
	if err != nil {
		return qmp.BlockNode{}, err
	}
	for _, n := range nodes {
		if n.Image.Filename == path && FormatDriver(n.Driver) {
			return n, nil
		}
	}
	return qmp.BlockNode{}, fmt.Errorf("QEMU has no node on %s", path)
}

// NamedNodes is query-named-block-nodes with the files of nodes on a
// disk's descriptors (/dev/fdset/N, internal/lifecycle/diskfds) named as their fd
// set's note names them, so that a node is found by its image's name
// however QEMU was given it.
func NamedNodes(ctx context.Context, c *qmp.Conn) ([]qmp.BlockNode, error) {
	nodes, err := c.QueryNamedBlockNodes(ctx)
	if err != nil || !slices.ContainsFunc(nodes, func(n qmp.BlockNode) bool { return strings.HasPrefix(n.Image.Filename, "/dev/fdset/") }) {
		return nodes, err
	}
	sets, err := c.QueryFDSets(ctx)
	if err != nil {
		return nil, fmt.Errorf("query-fdsets: %w", err)
	}
	files := map[string]string{}
	for _, s := range sets {
		for _, f := range s.FDs {
			if path, ok := FDSetFile(f.Opaque); ok {
				files[fmt.Sprintf("/dev/fdset/%d", s.FDSetID)] = path
			}
		}
	}
	byName := map[string]string{}
	for _, n := range nodes {
		byName[n.NodeName] = n.Image.Filename
	}
	for i, n := range nodes {
		file := n.Image.Filename
		if strings.HasPrefix(file, "json:") {
			// A format node with an explicit backing node is named by
			// its options: its file is its protocol node's (a
			// descriptor, or the path of a snapshot's overlay on a
			// descriptor base, which a merge must find by that path).
			if pf := byName[chainProtocolNode(n.NodeName)]; pf != "" {
				file = pf
				nodes[i].Image.Filename, nodes[i].File = pf, pf
			}
		}
		if p, ok := files[file]; ok {
			nodes[i].Image.Filename, nodes[i].File = p, p
		}
		// The backing of a node on an explicit chain is named as QEMU
		// names that node (/dev/fdset/N, or json: with its file's set):
		// RootOf walks a chain by it.
		b := n.BackingFile
		if f := jsonFile(b); f != "" {
			b = f
		}
		if p, ok := files[b]; ok {
			nodes[i].BackingFile = p
		}
	}
	return nodes, nil
}

// OnDescriptor reports whether QEMU reads format node node's image through
// an fd set (vmsup passed it), not a file it opened by name.
func OnDescriptor(ctx context.Context, c *qmp.Conn, node string) (bool, error) {
	nodes, err := c.QueryNamedBlockNodes(ctx)
	if err != nil {
		return false, err
	}
	files := map[string]string{}
	for _, n := range nodes {
		files[n.NodeName] = n.Image.Filename
	}
	f := files[node]
	if p := files[chainProtocolNode(node)]; p != "" {
		f = p
	} else if j := jsonFile(f); j != "" {
		f = j
	}
	return strings.HasPrefix(f, "/dev/fdset/"), nil
}

// jsonFile is the protocol file a json: filename of a format node names
// ("" for another filename).
func jsonFile(name string) string {
	js, ok := strings.CutPrefix(name, "json:")
	if !ok {
		return ""
	}
	var o struct {
		File struct {
			Filename string `json:"filename"`
		} `json:"file"`
	}
	if json.Unmarshal([]byte(js), &o) != nil {
		return ""
	}
	return o.File.Filename
}

// chainProtocolNode is the protocol node vmsup put under a format node of
// a disk's chain (qemuargs.ChainParts): "file-X" under "fmt-X", "bNNfX"
// under "bNN-X"; "" for others.
func chainProtocolNode(format string) string {
	if p := ProtocolNode(format); p != "" {
		return p
	}
	if len(format) > 4 && format[0] == 'b' && format[3] == '-' {
		return format[:3] + "f" + format[4:]
	}
	return ""
}

// FormatDriver reports whether a block driver reads an image format (the
// nodes vmsup and QEMU open on image files), not a protocol or a filter.
func FormatDriver(driver string) bool {
	switch driver {
	case "qcow2", "raw", "qed", "vmdk", "vdi", "vhdx", "vpc", "luks":
		return true
	}
	return false
}

// RootOf finds the top node of the chain node is in (the device's), and
// the image directly above node ("" when node is the top).
func RootOf(ctx context.Context, c *qmp.Conn, node string) (root, above string, err error) {
	blocks, err := c.QueryBlock(ctx)
	if err != nil {
		return "", "", err
	}
	nodes, err := NamedNodes(ctx, c)
	if err != nil {
		return "", "", err
	}
	byName := map[string]qmp.BlockNode{}
	for _, n := range nodes {
		byName[n.NodeName] = n
	}
	for _, b := range blocks {
		if b.Inserted == nil {
			continue
		}
		// Walk down the chain by backing file names.
		cur, prev := byName[b.Inserted.NodeName], ""
		for range 64 {
			if cur.NodeName == node {
				return b.Inserted.NodeName, prev, nil
			}
			if cur.BackingFile == "" {
				break
			}
			prev = cur.Image.Filename
			next, ok := nodeOnFile(nodes, cur.BackingFile)
			if !ok {
				break
			}
			cur = next
		}
	}
	return "", "", fmt.Errorf("node %s is in no device's chain", node)
}

func nodeOnFile(nodes []qmp.BlockNode, file string) (qmp.BlockNode, bool) {
	for _, n := range nodes {
		if n.Image.Filename == file && FormatDriver(n.Driver) {
			return n, true
		}
	}
	return qmp.BlockNode{}, false
}

// ProtocolNode is the name of the protocol node vmsup put under a format
// node it named ("" for QEMU's own names).
func ProtocolNode(format string) string {
	switch {
	case strings.HasPrefix(format, "fmt-"):
		return "file-" + strings.TrimPrefix(format, "fmt-")
	case strings.HasPrefix(format, "ovl-"):
		return "ovf-" + strings.TrimPrefix(format, "ovl-")
	}
	return ""
}

// CloseNode closes a merged image's nodes that vmsup named (at boot or by
// a snapshot): they stay open until deleted, and keep a reference on Into
// (which then is no root node for the next commit). QEMU's own, opened
// from a header, went with the commit.
func CloseNode(ctx context.Context, c *qmp.Conn, node string) {
	if QEMUOwned(node) {
		return
	}
	_ = c.BlockdevDel(ctx, node)
	if p := chainProtocolNode(node); p != "" {
		_ = c.BlockdevDel(ctx, p)
	}
}

// RemoveFileSets takes back the fd sets whose notes name image file path
// (FDSetFile), once no node uses it (a merged overlay's): a set QEMU kept
// would hold the deleted file's space.
func RemoveFileSets(ctx context.Context, c *qmp.Conn, path string) error {
	sets, err := c.QueryFDSets(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range sets {
		if slices.ContainsFunc(s.FDs, func(f qmp.FDSetFD) bool { p, ok := FDSetFile(f.Opaque); return ok && p == path }) {
			errs = append(errs, c.RemoveFD(ctx, s.FDSetID, nil))
		}
	}
	return errors.Join(errs...)
}

// DelParts deletes nodes (given protocol first: deleted top first) and
// objects, skipping what QEMU does not have.
func DelParts(ctx context.Context, c *qmp.Conn, nodes, objects []string) error {
	var errs []error
	for i := len(nodes) - 1; i >= 0; i-- {
		if QEMUOwned(nodes[i]) {
			continue // not the monitor's to delete: QEMU frees it when unused
		}
		if err := delRetry(ctx, c, nodes[i]); err != nil && !IsNotFound(err) {
			errs = append(errs, fmt.Errorf("blockdev-del %s: %w", nodes[i], err))
		}
	}
	for _, o := range objects {
		if err := c.ObjectDel(ctx, o); err != nil && !IsNotFound(err) {
			errs = append(errs, fmt.Errorf("object-del %s: %w", o, err))
		}
	}
	return errors.Join(errs...)
}

// QEMUOwned reports whether QEMU named a block node itself ("#block123"):
// one it opened from an image's header, which blockdev-del refuses.
func QEMUOwned(node string) bool { return strings.HasPrefix(node, "#") }

// delRetry deletes a node, trying again for a moment while QEMU
// says it is in use (a job that just ended can hold it briefly).
func delRetry(ctx context.Context, c *qmp.Conn, node string) error {
	for wait := 50 * time.Millisecond; ; wait *= 2 {
		err := c.BlockdevDel(ctx, node)
		if err == nil || !strings.Contains(err.Error(), "in use") || wait > 2*time.Second {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// IsNotFound: QEMU has no such node or object (7.2: "Failed to find node
// with node-name='X'", "object 'X' not found").
func IsNotFound(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "Failed to find node") || strings.Contains(msg, "not found")
}

// MoveHost is the host side of a move target of a VM whose state
// directory is dir.
func MoveHost(dir string, t spec.Disk) qemuargs.DiskHost {
	return qemuargs.DiskHost{SecretFile: MoveSecretFile(dir, t)}
}

// RunningParts are the block nodes and secret object disk d runs on,
// top the device's node: named as at boot, or as a move target (an
// earlier move in this run). Other names (a snapshot overlay's) are not
// vmsup's to close here.
func RunningParts(dir string, d spec.Disk, top string) (qemuargs.DiskParts, error) {
	switch top {
	case qemuargs.DiskNodeName(d.Name):
		img, sec := storage.HostFiles(dir, d)
		p, err := qemuargs.Disk(d, qemuargs.DiskHost{Image: img, SecretFile: cmp.Or(sec, "/dev/null")}, "pci.0")
		p.Objects = slices.DeleteFunc(p.Objects, func(o qemuargs.Object) bool { return o.QOMType != "secret" })
		return p, err
	case qemuargs.MoveNodeName(d.Name, d):
		return qemuargs.MoveTarget(d, MoveHost(dir, d))
	}
	for i := 1; i <= maxChain; i++ {
		if top == qemuargs.ChainNodeName(d.Name, i) {
			// A base of its boot chain, which a snapshot's removal
			// merged the disk down into (RemoveChain closes the rest).
			return qemuargs.DiskParts{Blockdevs: []qemuargs.Blockdev{{NodeName: qemuargs.ChainFileNodeName(d.Name, i)}, {NodeName: top}}}, nil
		}
	}
	if QEMUOwned(top) {
		// An image QEMU opened itself from an overlay's header, which a
		// snapshot's removal merged the disk down into: QEMU closes it
		// once the device lets go of it.
		return qemuargs.DiskParts{Blockdevs: []qemuargs.Blockdev{{NodeName: top}}}, nil
	}
	return qemuargs.DiskParts{}, fmt.Errorf("its device runs on node %s, which is not the disk's own (a snapshot overlay?): restart the VM first", top)
}

func PartNames(p qemuargs.DiskParts) (nodes, objects []string) {
	for _, b := range p.Blockdevs {
		nodes = append(nodes, b.NodeName)
	}
	for _, o := range p.Objects {
		objects = append(objects, o.ID)
	}
	return nodes, objects
}

// MoveSecretFile is where a target's key is copied for QEMU ("" for a
// target without one): the secret object reads it at creation.
func MoveSecretFile(dir string, t spec.Disk) string {
	if !t.NeedsSecret() {
		return ""
	}
	_, sec := storage.HostFiles(dir, t)
	return sec
}

// DeviceNode is the node disk's device runs on (query-block's inserted
// node): its format node, or the overlay a snapshot put on it.
func DeviceNode(ctx context.Context, c *qmp.Conn, disk string) (string, error) {
	blocks, err := c.QueryBlock(ctx)
	if err != nil {
		return "", err
	}
	id := qemuargs.DiskDeviceID(disk)
	for _, b := range blocks {
		// virtio-blk's backend is a child of the device: its QOM path.
		if b.Inserted != nil && (b.QdevID == id || strings.HasPrefix(b.QdevID, "/machine/peripheral/"+id+"/") ||
			b.QdevID == "/machine/peripheral/"+id) {
			return b.Inserted.NodeName, nil
		}
	}
	return "", fmt.Errorf("QEMU has no device %s with an image in it", id)
}

// MovedParts is parts (of disk d, named as at boot) as QEMU has them: a
// disk moved in this run runs on its move target's nodes and key.
func MovedParts(ctx context.Context, c *qmp.Conn, dir string, d spec.Disk, parts qemuargs.DiskParts) (qemuargs.DiskParts, error) {
	top, err := DeviceNode(ctx, c, d.Name)
	if err != nil || top != qemuargs.MoveNodeName(d.Name, d) {
		return parts, nil // as booted (or the device is gone already)
	}
	mp, err := qemuargs.MoveTarget(d, MoveHost(dir, d))
	if err != nil {
		return parts, err
	}
	parts.Blockdevs = mp.Blockdevs
	parts.Objects = append(slices.DeleteFunc(parts.Objects, func(o qemuargs.Object) bool { return o.QOMType == "secret" }), mp.Objects...)
	return parts, nil
}
