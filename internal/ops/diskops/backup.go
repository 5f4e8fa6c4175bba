package diskops

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/backupchain"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// Backups: each point copies every writable disk into a new qcow2 file of
// a backup directory (internal/vm/backupchain keeps the chain and the manifest).
// A running VM is copied by QEMU's blockdev-backup jobs (copy-before-write:
// the guest never pauses), all disks started in one transaction together
// with a new persistent dirty bitmap per disk, so the bitmap records
// exactly the writes the next incremental point must copy. The bitmap is
// stored in the qcow2 image, so it survives a restart; a QEMU that dies
// without saving it marks it inconsistent, and the next point is full.
//
// vmsup creates and opens the target files and passes them to QEMU as
// descriptors (add-fd): the confined QEMU needs no path to the directory.

const opBackup operation.Kind = "backup"

// BackupOptions say where a backup goes and what kind it is.
type BackupOptions struct {
	Dir string // the backup directory (made if missing)
	// Incremental copies only what changed since the directory's last
	// point; a disk whose dirty bitmap is unusable is copied in full, and
	// its result says why. It needs a full backup in Dir.
	Incremental bool
	// Progress, when set, sees the copy go (a running VM only).
	Progress func(BackupProgress)
}

// BackupProgress is the copy's progress, summed over the disks.
type BackupProgress struct {
	Done    int64         `json:"done"`  // bytes
	Total   int64         `json:"total"` // bytes; may grow
	Elapsed time.Duration `json:"elapsed_ns"`
}

// BackupResult reports a backup point taken.
type BackupResult struct {
	VM    string `json:"name"`
	Dir   string `json:"dir"`
	Point int    `json:"point"`
	Live  bool   `json:"live"`
	// Quiesced says how the guest's filesystems were made consistent at
	// the point: "fsfreeze (N filesystems)" through the guest agent, or
	// why the copy is crash-consistent only ("VM off" for a VM that is off).
	Quiesced string                  `json:"quiesced"`
	Disks    []backupchain.DiskPoint `json:"disks"`
	Duration time.Duration           `json:"duration_ns"`
}

// backupIntent is a backup's journal entry: what recovery must find and
// take back (jobs, nodes, fd sets, the new bitmaps, the point's files)
// when its command died before the point was in the manifest.
type backupIntent struct {
	Dir   string                 `json:"dir"`
	Point int                    `json:"point"`
	Live  bool                   `json:"live"`
	Chain string                 `json:"chain"`
	Disks []backupchain.DiskPlan `json:"disks"`
}

// Backup takes the next backup point of VM name into o.Dir.
func (s *Service) Backup(ctx context.Context, name string, o BackupOptions) (BackupResult, error) {
	res := BackupResult{VM: name, Dir: o.Dir}
	fail := func(err error) (BackupResult, error) {
		return res, vmerr.Wrap(name, fmt.Errorf("backup to %s: %w", res.Dir, err))
	}
	dir, err := backupDir(o.Dir)
	if err != nil {
		return fail(err)
	}
	res.Dir = dir
	lk, err := s.lock(ctx, name, string(opBackup))
	if err != nil {
		return res, err
	}
	defer lk.Unlock()
	v, err := s.env.View(name)
	stopped := errors.Is(err, vmstore.ErrNotRunning)
	if err != nil && !stopped {
		return fail(err)
	}
	m, err := backupManifest(dir, name, v.Applied, o.Incremental, stopped)
	if err != nil {
		return fail(err)
	}
	disks, err := backupDisks(v)
	if err != nil {
		return fail(err)
	}
	b := &backupRun{s: s, name: name, m: m, opts: o, in: backupIntent{Dir: dir, Point: m.Next(), Live: !stopped, Chain: m.Chain}}
	if !stopped {
		c, release, err := s.env.QMPSession(ctx, name)
		if err != nil {
			return fail(err)
		}
		defer release()
		b.c = c
	}
	if err := b.plan(ctx, disks); err != nil {
		return fail(err)
	}
	start := time.Now()
	if err := b.run(ctx); err != nil {
		// undone by the steps' undos; a journal that could not be begun did nothing
		return fail(b.explain(steps.Cause(err)))
	}
	res.Point, res.Live, res.Disks, res.Duration = b.in.Point, b.in.Live, b.points, time.Since(start)
	res.Quiesced = b.quiesced
	s.env.Lifecycle(name, "backup", map[string]any{"dir": dir, "point": res.Point})
	return res, nil
}

// backupDir is o.Dir made absolute and existing (owner-only when made).
func backupDir(dir string) (string, error) {
	if dir == "" {
		return "", errors.New("no backup directory (--to DIR)")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return "", err
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("%s is not a directory", abs)
	}
	return abs, nil
}

// backupManifest is dir's manifest (a new one for an empty directory),
// refused when it holds another VM's chain or cannot serve the request.
func backupManifest(dir, name string, app *vmstore.Applied, incremental, stopped bool) (*backupchain.Manifest, error) {
	m, err := backupchain.Load(dir)
	if err != nil {
		return nil, err
	}
	uuid := ""
	if app != nil {
		uuid = app.UUID
	}
	if m == nil {
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			return nil, fmt.Errorf("%s is not empty and has no %s: use an empty directory or an existing backup directory of this VM", dir, backupchain.ManifestName)
		}
		m = backupchain.New(name, uuid)
	}
	if err := m.Owned(dir, name, uuid); err != nil {
		return nil, err
	}
	switch {
	case incremental && !m.HasFull():
		return nil, fmt.Errorf("--incremental: %s holds no full backup of %s to build on: take a full one first (without --incremental)", dir, name)
	case incremental && stopped:
		return nil, errors.New("--incremental: the VM is not running (its dirty bitmaps are read by QEMU): start it, or take a full backup")
	}
	return m, nil
}

// backupDisks lists the disks a backup copies (every writable image file;
// CD-ROMs, seeds and read-only disks are not state) and refuses the kinds
// it cannot copy yet.
func backupDisks(v *vmstore.View) ([]backupchain.Disk, error) {
	var out []backupchain.Disk
	for _, d := range v.Writable() {
		if d.Type != spec.DiskFile {
			return nil, fmt.Errorf("disk %q is of type %s: backups copy image files (qcow2, raw) only; %s disks are not supported yet", d.Name, d.Type, d.Type)
		}
		out = append(out, backupchain.Disk{Name: d.Name, Image: d.Active.Path, Format: d.Active.Format})
	}
	if len(out) == 0 {
		return nil, errors.New("the VM has no writable image disk to back up")
	}
	return out, nil
}

// backupRun is one backup point's steps.
type backupRun struct {
	s      *Service
	name   string
	m      *backupchain.Manifest
	opts   BackupOptions
	in     backupIntent
	c      *qmp.Conn // nil: the VM is off
	points []backupchain.DiskPoint
	op     *operation.Op
	// quiesced is how the point was made consistent (quiesce's How).
	quiesced string
}

// run runs the point's steps as one journaled operation (the quiesce
// journals its freeze in it, for recovery to thaw).
func (b *backupRun) run(ctx context.Context) error {
	op, err := b.s.k.Begin(ctx, b.name, opBackup, b.in)
	if err != nil {
		return err
	}
	defer op.End()
	b.op, b.quiesced = op, "VM off"
	_, err = steps.Run(ctx, b.name, b.steps(), op.After())
	return err
}

// plan reads each disk's state (QEMU's, or qemu-img's for a VM that is
// off) and plans its part of the point.
func (b *backupRun) plan(ctx context.Context, disks []backupchain.Disk) error {
	for _, d := range disks {
		if b.c != nil {
			n, err := qdev.FindNode(ctx, b.c, d.Image)
			if err != nil {
				return fmt.Errorf("disk %q: %w", d.Name, err)
			}
			d.Format, d.Size = n.Driver, n.Image.VirtualSize
			for _, bm := range n.DirtyBitmaps {
				d.Bitmaps = append(d.Bitmaps, backupchain.Bitmap{Name: bm.Name, Persistent: bm.Persistent, Recording: bm.Recording, Inconsistent: bm.Inconsistent})
			}
		} else {
			info, err := b.s.env.Tools().Info(ctx, d.Image, d.Format)
			if err != nil {
				return fmt.Errorf("disk %q: %w", d.Name, err)
			}
			d.Format, d.Size = info.Format, info.VirtualSize
		}
		p := b.m.Plan(b.in.Point, b.opts.Incremental, d)
		if b.c == nil {
			p.NewBitmap = "" // qemu-img does not make one: the next point is full
		}
		b.in.Disks = append(b.in.Disks, p)
	}
	return nil
}

func (b *backupRun) steps() []step {
	list := []step{{Name: "files", Do: b.createFiles, Undo: b.removeFiles}}
	if b.c != nil {
		list = append(list,
			step{Name: "nodes", Do: b.addNodes, Undo: b.detach},
			step{Name: "start", Do: b.start, Undo: b.abort},
			step{Name: "copy", Do: b.wait},
			step{Name: "detach", Do: b.finish})
	} else {
		list = append(list, step{Name: "copy", Do: b.convert})
	}
	list = append(list, step{Name: "sums", Do: b.sums}, step{Name: "manifest", Do: b.record})
	if b.c != nil {
		list = append(list, step{Name: "bitmaps", Do: b.dropOldBitmaps})
	}
	return list
}

func (b *backupRun) path(p backupchain.DiskPlan) string { return filepath.Join(b.in.Dir, p.File) }

// createFiles makes the point's qcow2 files, owner-only: an incremental
// one on the previous point's file (named relative to the directory, so
// the directory can move).
func (b *backupRun) createFiles(ctx context.Context) error {
	for _, p := range b.in.Disks {
		var err error
		if p.Mode == backupchain.Incremental {
			err = b.s.env.Tools().CreateOverlay(ctx, b.path(p), p.Backing, "qcow2", p.Size)
		} else {
			err = b.s.env.Tools().Create(ctx, b.path(p), "qcow2", p.Size, "", "")
		}
		if err != nil {
			return fmt.Errorf("disk %q: %w", p.Disk, err)
		}
	}
	return nil
}

func (b *backupRun) removeFiles(context.Context) { removeBackupFiles(b.in) }

func removeBackupFiles(in backupIntent) {
	for _, p := range in.Disks {
		os.Remove(filepath.Join(in.Dir, p.File))
	}
}

// convert copies a VM that is off with qemu-img (its whole chain, when
// it runs on a snapshot's overlay).
func (b *backupRun) convert(ctx context.Context) error {
	for i, p := range b.in.Disks {
		if err := b.s.env.Tools().Convert(ctx, p.Image, "", b.path(p), "qcow2", true); err != nil {
			return fmt.Errorf("disk %q: %w", p.Disk, err)
		}
		b.points = append(b.points, b.pointOf(i, p.Size))
	}
	return nil
}

func (b *backupRun) pointOf(i int, copied int64) backupchain.DiskPoint {
	p := b.in.Disks[i]
	return backupchain.DiskPoint{Disk: p.Disk, File: p.File, Mode: p.Mode, Reason: p.Reason, Backing: p.Backing, Size: p.Size, Copied: copied, Image: p.Image}
}

// sums checksums each file (synced first) and measures what it holds:
// the copy's real size (a job's progress counts the disk's virtual size).
func (b *backupRun) sums(ctx context.Context) error {
	for i := range b.points {
		path := filepath.Join(b.in.Dir, b.points[i].File)
		sum, err := backupchain.Sum(path)
		if err != nil {
			return err
		}
		b.points[i].SHA256 = sum
		if n, err := b.s.env.Tools().DataBytes(ctx, path, "qcow2"); err == nil {
			b.points[i].Copied = n
		} else {
			b.s.env.Opts().Logger.Warn("backup: the point's data size", "vm", b.name, "disk", b.points[i].Disk, "err", err)
		}
	}
	return nil
}

// record writes the point into the manifest: from here on it exists.
func (b *backupRun) record(context.Context) error {
	b.m.Points = append(b.m.Points, backupchain.Point{N: b.in.Point, Time: time.Now().UTC(), Live: b.in.Live, Quiesced: b.quiesced, Disks: b.points})
	return b.m.Save(b.in.Dir)
}

// explain makes a full target directory say so.
func (b *backupRun) explain(err error) error {
	if strings.Contains(err.Error(), "No space left on device") || errors.Is(err, syscall.ENOSPC) {
		free := ""
		if n, ferr := freeBytes(b.in.Dir); ferr == nil {
			free = fmt.Sprintf(" (%.1f MiB free)", float64(n)/(1<<20))
		}
		return fmt.Errorf("not enough space%s: %w", free, err)
	}
	return err
}
