package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/vmsup/vmsup/internal/snapshot"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Removing a snapshot merges, for each disk, the one image built on its
// frozen image down into it: live with QEMU's block-commit (an active
// commit pivots the disk onto the merged image), offline with qemu-img.
// Each part can be done again, so a killed removal is finished by running
// it again (recovery).

const opSnapshotRemove = "snapshot-rm"

type snapRmIntent struct {
	Tag    string           `json:"tag"`
	Merges []snapshot.Merge `json:"merges"`
	Memory string           `json:"memory,omitempty"`
	RBD    []spec.Disk      `json:"rbd,omitempty"` // their RBD snapshots go
}

// RemoveSnapshot removes snapshot tag of VM name, running or off.
// progress, when set, sees each live merge go.
func (s *Supervisor) RemoveSnapshot(ctx context.Context, name, tag string, progress func(disk string, done, total int64)) error {
	fail := func(err error) error { return vmErr(name, fmt.Errorf("remove snapshot %q: %w", tag, err)) }
	lk, err := s.lock(ctx, name, opSnapshotRemove)
	if err != nil {
		return err
	}
	defer lk.Unlock()
	tree, err := snapshot.Load(s.paths(name).Snapshots())
	if err != nil {
		return fail(err)
	}
	if clones := s.liveClones(tree); len(clones) > 0 {
		return fail(fmt.Errorf("VMs %s were cloned from its snapshots and stand on their images: remove them first", strings.Join(clones, ", ")))
	}
	snap, merges, err := tree.PlanRemove(tag)
	if err != nil {
		return fail(err)
	}
	in := snapRmIntent{Tag: tag, Merges: merges, Memory: snap.Memory}
	if len(snap.RBD) > 0 {
		v, err := s.view(name)
		if err != nil && !errors.Is(err, ErrNotRunning) {
			return fail(err)
		}
		disks, err := s.snapshotDisks(v)
		if err != nil {
			return fail(err)
		}
		for _, d := range disks.rbd {
			if _, ok := snap.RBD[d.Name]; ok {
				in.RBD = append(in.RBD, d)
			}
		}
	}
	op, err := s.beginOp(ctx, name, opSnapshotRemove, in)
	if err != nil {
		return fail(err)
	}
	if err := s.finishRemove(ctx, name, op, in, progress); err != nil {
		return fail(err) // the journal stays: the next command finishes it
	}
	op.End()
	s.lifecycle(name, "snapshot-rm", map[string]any{"tag": tag})
	return nil
}

func (s *Supervisor) recoverSnapshotRemove(ctx context.Context, name string, op *vmstate.Op) (string, error) {
	in, err := intentOf[snapRmIntent](op)
	if err != nil {
		return "", err
	}
	if err := s.finishRemove(ctx, name, op, in, nil); err != nil {
		return "", err
	}
	return fmt.Sprintf("removed snapshot %q", in.Tag), nil
}

// finishRemove merges, records, then deletes the merged files.
func (s *Supervisor) finishRemove(ctx context.Context, name string, op *vmstate.Op, in snapRmIntent, progress func(string, int64, int64)) error {
	p := s.paths(name)
	tree, err := snapshot.Load(p.Snapshots())
	if err != nil {
		return err
	}
	if tree.Find(in.Tag) != nil { // not recorded yet: merge
		c, release, err := s.qmpSession(ctx, name)
		switch {
		case err == nil:
			defer release()
		case errors.Is(err, ErrNotRunning), errors.Is(err, ErrNotFound):
			c = nil
		default:
			return err
		}
		for _, m := range in.Merges {
			if m.From == nil || !exists(m.From.Path) {
				continue
			}
			if err := s.merge(ctx, name, c, m, progress); err != nil {
				return fmt.Errorf("disk %q: %w", m.Disk, err)
			}
			s.traced(op)(name, "merged "+m.Disk)
		}
		for _, d := range in.RBD {
			if err := s.tools().RBDSnap(ctx, d, "rm", snapshot.RBDSnapName(in.Tag)); err != nil {
				return fmt.Errorf("disk %q: %w", d.Name, err)
			}
		}
		tree.Removed(in.Tag, in.Merges)
		if err := tree.Save(p.Snapshots()); err != nil {
			return err
		}
	}
	var drop []string
	for _, m := range in.Merges {
		if m.Drop != "" {
			drop = append(drop, m.Drop)
		}
	}
	if in.Memory != "" {
		drop = append(drop, in.Memory)
	}
	for _, f := range drop {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// merge commits m.From into m.Into: with QEMU's block-commit when the
// running QEMU has From open, else with qemu-img (no QEMU has it open:
// PlanRemove refuses a base of two branches). Images on From are re-based
// on Into (QEMU re-bases the one it has open itself).
func (s *Supervisor) merge(ctx context.Context, name string, c *qmp.Conn, m snapshot.Merge, progress func(string, int64, int64)) error {
	var live bool
	if c != nil {
		if _, err := findNode(ctx, c, m.From.Path); err == nil {
			live = true
		}
	}
	var open string // the image QEMU re-bases itself
	if live {
		var err error
		if open, err = s.commitLive(ctx, name, c, m, progress); err != nil {
			return err
		}
	} else if err := s.tools().Commit(ctx, m.From.Path); err != nil {
		return err
	}
	for _, r := range m.Rebase {
		if r == open {
			continue
		}
		if err := s.tools().Rebase(ctx, r, m.Into.Path, m.Into.Format); err != nil {
			return err
		}
	}
	return nil
}

// commitLive runs block-commit of From into Into in the running QEMU and
// returns the image above From that QEMU re-based ("" for an active
// commit, which pivots the disk onto Into).
func (s *Supervisor) commitLive(ctx context.Context, name string, c *qmp.Conn, m snapshot.Merge, progress func(string, int64, int64)) (string, error) {
	// QEMU opened Into read-only (a backing image) and was granted it so:
	// the commit writes it.
	if err := s.ConfinePaths(ctx, name, units.PathRule{Path: m.Into.Path, Mode: "rwk"}); err != nil {
		return "", err
	}
	top, err := findNode(ctx, c, m.From.Path)
	if err != nil {
		return "", err
	}
	base, err := findNode(ctx, c, m.Into.Path)
	if err != nil {
		return "", err
	}
	device, above, err := rootOf(ctx, c, top.NodeName)
	if err != nil {
		return "", err
	}
	id := "vmsup-commit-" + m.Disk
	no := false
	if err := c.BlockCommit(ctx, qmp.Commit{JobID: id, Device: device, TopNode: top.NodeName, BaseNode: base.NodeName,
		AutoDismiss: &no}); err != nil {
		return "", err
	}
	prog := func(j qmp.Job) {
		if progress != nil {
			progress(m.Disk, j.CurrentProgress, j.TotalProgress)
		}
	}
	if above == "" { // active commit: ready, then pivot
		if _, err := qmp.WaitJob(ctx, c, id, func(j qmp.Job) bool { return j.Status == "ready" }, prog); err != nil {
			_ = c.JobDismiss(context.WithoutCancel(ctx), id)
			return "", err
		}
		if err := c.JobComplete(ctx, id); err != nil {
			return "", err
		}
	}
	_, err = qmp.WaitJob(ctx, c, id, func(j qmp.Job) bool { return j.Status == "concluded" }, prog)
	_ = c.JobDismiss(context.WithoutCancel(ctx), id)
	if err != nil {
		return "", err
	}
	// Nodes vmsup named (at boot or by a snapshot) stay until deleted, and
	// keep a reference on Into (which then is no root node for the next
	// commit): close the merged file. QEMU's own, opened from a header,
	// went with the commit.
	_ = c.BlockdevDel(ctx, top.NodeName)
	if p := protocolNode(top.NodeName); p != "" {
		_ = c.BlockdevDel(ctx, p)
	}
	return above, nil
}

// rootOf finds the top node of the chain node is in (the device's), and
// the image directly above node ("" when node is the top).
func rootOf(ctx context.Context, c *qmp.Conn, node string) (root, above string, err error) {
	blocks, err := c.QueryBlock(ctx)
	if err != nil {
		return "", "", err
	}
	nodes, err := c.QueryNamedBlockNodes(ctx)
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
		if n.Image.Filename == file && n.Driver != "file" && n.Driver != "host_device" {
			return n, true
		}
	}
	return qmp.BlockNode{}, false
}

// protocolNode is the name of the protocol node vmsup put under a format
// node it named ("" for QEMU's own names).
func protocolNode(format string) string {
	switch {
	case strings.HasPrefix(format, "fmt-"):
		return "file-" + strings.TrimPrefix(format, "fmt-")
	case strings.HasPrefix(format, "ovl-"):
		return "ovf-" + strings.TrimPrefix(format, "ovl-")
	}
	return ""
}
