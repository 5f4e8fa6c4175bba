package diskops

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// An NBD export of a running VM's disks at one moment, for external
// (pull-mode) backup tools: each disk gets a "fleece" overlay that QEMU
// fills with the old data just before the guest overwrites it
// (blockdev-backup sync=none), so the overlay reads as the disk did when
// the export began; QEMU's NBD server serves it on a socket vmsup binds and
// hands over. With it goes a dirty bitmap of what changed since the
// previous export (vmsup-nbd-N, persistent in the qcow2 image): the export
// disables N and starts N+1 in the same transaction, so the next export's
// bitmap picks up exactly where this one's view ends.

const opNBDExport operation.Kind = "nbd-export"

// ExportOptions say where an export serves and whom to tell.
type ExportOptions struct {
	// Socket is the unix socket path clients connect to; vmsup binds it
	// (it must not exist).
	Socket string
	// Ready, when set, is called once the export serves.
	Ready func(ExportInfo)
}

// ExportInfo is what a client needs.
type ExportInfo struct {
	VM      string       `json:"name"`
	Socket  string       `json:"socket"`
	Exports []ExportDisk `json:"exports"`
}

// ExportDisk is one disk's export.
type ExportDisk struct {
	Disk   string `json:"disk"`
	Export string `json:"export"` // the NBD export name
	// Bitmap is the dirty bitmap of what changed since the previous
	// export ("qemu:dirty-bitmap:" + Bitmap as an NBD metadata context);
	// "" with Reason when there is none to trust: read the whole disk.
	Bitmap string `json:"bitmap"`
	Reason string `json:"reason"`
	// Image is the image QEMU serves the disk from (its active image).
	Image string `json:"image"`
}

// nbdIntent is an export's journal entry: what recovery takes down.
type nbdIntent struct {
	Socket string    `json:"socket"`
	Disks  []nbdDisk `json:"disks"`
}

type nbdDisk struct {
	Disk    string `json:"disk"`
	Node    string `json:"node"`    // the disk's active node
	Fleece  string `json:"fleece"`  // the overlay file (root-only records)
	Old     string `json:"old"`     // the bitmap exported ("" for none)
	New     string `json:"new"`     // the bitmap started for the next export
	Clean   string `json:"clean"`   // why Old is not exported, if it is not
	Format  string `json:"format"`  // the active image's format
	Image   string `json:"image"`   // the active image
	Virtual int64  `json:"virtual"` // its size
}

func nbdJobID(disk string) string     { return "vmsup-nbd-" + disk }
func nbdExportID(disk string) string  { return "vmsup-nbd-" + disk }
func fleeceNode(file string) string   { return "flq-" + fileHash(file) }
func fleeceFile(file string) string   { return "flf-" + fileHash(file) }
func fleeceOpaque(file string) string { return "vmsup-nbd:" + file }

const nbdFD = "vmsup-nbd"

// ExportNBD exports VM name's writable image disks over NBD at one moment
// and serves until ctx ends, then takes it all down; the bitmap of the
// next export starts at this export's moment. The VM's lock is held while
// it serves (other commands on the VM wait or say it is busy); status
// still answers.
func (s *Service) ExportNBD(ctx context.Context, name string, o ExportOptions) error {
	fail := func(err error) error { return vmerr.Wrap(name, fmt.Errorf("nbd export: %w", err)) }
	if o.Socket == "" {
		return fail(errors.New("no socket path"))
	}
	sock, err := filepath.Abs(o.Socket)
	if err != nil {
		return fail(err)
	}
	if _, err := os.Lstat(sock); err == nil {
		return fail(fmt.Errorf("%s exists", sock))
	}
	lk, err := s.lock(ctx, name, string(opNBDExport))
	if err != nil {
		return err
	}
	defer lk.Unlock()
	v, err := s.env.View(name)
	if err != nil {
		return fail(err)
	}
	e := &nbdRun{s: s, name: name, in: nbdIntent{Socket: sock}}
	if err := e.plan(ctx, v); err != nil {
		return fail(err)
	}
	op, err := s.k.Begin(ctx, name, opNBDExport, e.in)
	if err != nil {
		e.release()
		return fail(err)
	}
	e.op = op
	_, err = steps.Run(ctx, name, e.steps(), op.After())
	e.release() // serve without holding QEMU's monitor: status must answer
	if err != nil {
		op.End() // undone by the steps' undos
		return fail(steps.Cause(err))
	}
	if o.Ready != nil {
		o.Ready(e.info())
	}
	<-ctx.Done()
	// A clean end: the next export's bitmap starts here.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	if err := s.takeDownExport(tctx, name, e.in, true); err != nil {
		return fail(err) // the journal stays: the next command takes it down
	}
	op.End()
	return nil
}

type nbdRun struct {
	s       *Service
	name    string
	in      nbdIntent
	op      *operation.Op
	c       *qmp.Conn
	release func()
}

// plan picks the disks, their active nodes and bitmaps.
func (e *nbdRun) plan(ctx context.Context, v *vmstore.View) error {
	c, release, err := e.s.env.QMPSession(ctx, e.name)
	if err != nil {
		return err
	}
	e.c, e.release = c, release
	nodes, err := c.QueryNamedBlockNodes(ctx)
	if err != nil {
		release()
		return err
	}
	for _, d := range v.Disks {
		if d.IsCDROM() || d.Type != spec.DiskFile {
			continue
		}
		im := d.Active
		n, err := qdev.FindNode(ctx, c, im.Path)
		if err != nil {
			release()
			return fmt.Errorf("disk %q: %w", d.Name, err)
		}
		nd := nbdDisk{Disk: d.Name, Node: n.NodeName, Image: im.Path, Format: im.Format, Virtual: n.Image.VirtualSize,
			Fleece: filepath.Join(e.s.paths(e.name).Records, "nbd-"+d.Name+".qcow2")}
		nd.Old, nd.New, nd.Clean = nbdBitmaps(nodes, n.NodeName, im.Format)
		e.in.Disks = append(e.in.Disks, nd)
	}
	if len(e.in.Disks) == 0 {
		release()
		return errors.New("the VM has no image disk to export")
	}
	return nil
}

// nbdBitmaps finds the node's last export bitmap: the one to export and
// the next one's name, or why the export has none.
func nbdBitmaps(nodes []qmp.BlockNode, node, format string) (old, next, why string) {
	if format != spec.FormatQcow2 {
		return "", "", "the image is raw: it cannot keep a dirty bitmap"
	}
	last := -1
	var lastBM qmp.DirtyBitmap
	for _, n := range nodes {
		if n.NodeName != node {
			continue
		}
		for _, b := range n.DirtyBitmaps {
			if v, ok := strings.CutPrefix(b.Name, "vmsup-nbd-"); ok {
				if i, err := strconv.Atoi(v); err == nil && i > last {
					last, lastBM = i, b
				}
			}
		}
	}
	next = fmt.Sprintf("vmsup-nbd-%d", last+1)
	switch {
	case last < 0:
		return "", next, "no earlier export of this image (or a snapshot moved the disk onto a new overlay)"
	case lastBM.Inconsistent:
		return "", next, "its bitmap is inconsistent (QEMU stopped without saving it)"
	}
	return lastBM.Name, next, ""
}

func (e *nbdRun) steps() []step {
	return []step{
		{Name: "fleece", Do: e.addFleece, Undo: func(ctx context.Context) { removeFleece(ctx, e.c, e.in) }},
		{Name: "jobs", Do: e.startJobs, Undo: func(ctx context.Context) { stopFleeceJobs(ctx, e.c, e.in, false) }},
		{Name: "listen", Do: e.listen, Undo: func(ctx context.Context) { _ = e.c.NBDServerStop(ctx); os.Remove(e.in.Socket) }},
		{Name: "export", Do: e.export},
	}
}

// addFleece makes each disk's fleece overlay (backed by the disk's own
// node, so it reads through to the live disk until the job copies old
// data into it) and hands it to QEMU as an fd set.
func (e *nbdRun) addFleece(ctx context.Context) error {
	for _, d := range e.in.Disks {
		os.Remove(d.Fleece) // a leftover of a crash
		if err := e.s.env.Tools().CreateOverlay(ctx, d.Fleece, d.Image, d.Format, d.Virtual); err != nil {
			return fmt.Errorf("disk %q: %w", d.Disk, err)
		}
		f, err := os.OpenFile(d.Fleece, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		fd, err := e.c.AddFD(ctx, nil, fleeceOpaque(d.Fleece), f)
		f.Close() // QEMU has its own copy
		if err != nil {
			return fmt.Errorf("disk %q: add-fd: %w", d.Disk, err)
		}
		proto := qemuargs.Blockdev{Driver: "file", NodeName: fleeceFile(d.Fleece), Filename: fmt.Sprintf("/dev/fdset/%d", fd.FDSetID)}
		if err := e.c.BlockdevAdd(ctx, proto); err != nil {
			return fmt.Errorf("disk %q: %w", d.Disk, err)
		}
		backing := d.Node
		q := qemuargs.OverlayBlockdev{Blockdev: qemuargs.Blockdev{Driver: "qcow2", NodeName: fleeceNode(d.Fleece), File: proto.NodeName, ReadOnly: false}, Backing: &backing}
		if err := e.c.BlockdevAdd(ctx, q); err != nil {
			return fmt.Errorf("disk %q: %w", d.Disk, err)
		}
	}
	return nil
}

// startJobs starts, at one moment for all disks, the copy-before-write
// jobs into the fleece overlays, the next bitmaps, and stops the exported
// ones.
func (e *nbdRun) startJobs(ctx context.Context) error {
	var acts []qmp.TransactionAction
	no := false
	for _, d := range e.in.Disks {
		acts = append(acts, qmp.BackupAction(qmp.Backup{JobID: nbdJobID(d.Disk), Device: d.Node, Target: fleeceNode(d.Fleece),
			Sync: "none", AutoDismiss: &no}))
		if d.New != "" {
			acts = append(acts, qmp.BitmapAddAction(qmp.BitmapAdd{Node: d.Node, Name: d.New, Persistent: true}))
		}
		if d.Old != "" {
			acts = append(acts, qmp.BitmapDisableAction(d.Node, d.Old))
		}
	}
	return e.c.Transaction(ctx, acts, false)
}

// listen binds the socket and hands it to QEMU's NBD server.
func (e *nbdRun) listen(ctx context.Context) error {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: e.in.Socket, Net: "unix"})
	if err != nil {
		return err
	}
	ln.SetUnlinkOnClose(false) // QEMU serves on it after vmsup's copy closes
	f, err := ln.File()
	ln.Close()
	if err != nil {
		return err
	}
	defer f.Close()
	if err := e.c.GetFD(ctx, nbdFD, f); err != nil {
		return err
	}
	return e.c.NBDServerStartFD(ctx, nbdFD)
}

func (e *nbdRun) export(ctx context.Context) error {
	for _, d := range e.in.Disks {
		x := qmp.BlockExport{ID: nbdExportID(d.Disk), NodeName: fleeceNode(d.Fleece), Name: d.Disk}
		if d.Old != "" {
			x.Bitmaps = []string{d.Old}
		}
		if err := e.c.BlockExportAdd(ctx, x); err != nil {
			return fmt.Errorf("disk %q: %w", d.Disk, err)
		}
	}
	return nil
}

func (e *nbdRun) info() ExportInfo {
	out := ExportInfo{VM: e.name, Socket: e.in.Socket}
	for _, d := range e.in.Disks {
		out.Exports = append(out.Exports, ExportDisk{Disk: d.Disk, Export: d.Disk, Bitmap: d.Old, Reason: d.Clean, Image: d.Image})
	}
	return out
}
