package diskops

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/vm/backupchain"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/storage"
)

// The live half of a backup: the target files passed to QEMU as fd sets
// and opened as qcow2 nodes, the jobs started in one transaction, waited
// for, and everything QEMU holds for them taken back.

// Names QEMU knows a backup's pieces by, derived from the target file so
// that recovery finds them again from the journal.
func backupJobID(disk string) string { return "vmsup-backup-" + disk }
func backupNode(file string) string  { return "bkq-" + fileHash(file) }
func backupFile(file string) string  { return "bkf-" + fileHash(file) }
func backupFDOpaque(file string) string {
	return "vmsup-backup:" + file
}

func fileHash(file string) string {
	h := sha256.Sum256([]byte(file))
	return hex.EncodeToString(h[:8])
}

// addNodes opens each target file, passes it to QEMU (add-fd) and adds its
// protocol and qcow2 nodes.
func (b *backupRun) addNodes(ctx context.Context) error {
	for _, p := range b.in.Disks {
		if err := b.addNode(ctx, b.path(p)); err != nil {
			return fmt.Errorf("disk %q: target %s: %w", p.Disk, b.path(p), err)
		}
	}
	return nil
}

func (b *backupRun) addNode(ctx context.Context, path string) error {
	// Beneath the point's directory (no symlink), and checked: the file
	// vmsup just made, never another a name swap put there.
	f, err := storage.OpenBeneath(b.in.Dir, path, os.O_RDWR)
	if err != nil {
		return err
	}
	defer f.Close() // QEMU has its own copy
	if o, err := storage.CheckDiskObject(f); err != nil {
		return err
	} else if o.Kind != storage.ObjectRegular {
		return errors.New("not a regular file")
	}
	fd, err := b.c.AddFD(ctx, nil, backupFDOpaque(path), f)
	if err != nil {
		return fmt.Errorf("add-fd: %w", err)
	}
	proto := qemuargs.Blockdev{Driver: "file", NodeName: backupFile(path), Filename: fmt.Sprintf("/dev/fdset/%d", fd.FDSetID)}
	if err := b.c.BlockdevAdd(ctx, proto); err != nil {
		return err
	}
	target := qemuargs.OverlayBlockdev{Blockdev: qemuargs.Blockdev{Driver: "qcow2", NodeName: backupNode(path), File: backupFile(path)}}
	return b.c.BlockdevAdd(ctx, target)
}

// detach takes back what addNodes gave QEMU (whatever part of it exists).
func (b *backupRun) detach(ctx context.Context) { detachTargets(ctx, b.c, b.in) }

// finish dismisses the concluded jobs (they hold their targets), then
// detaches the targets.
func (b *backupRun) finish(ctx context.Context) error {
	dismissJobs(ctx, b.c, b.in)
	b.detach(ctx)
	return nil
}

func dismissJobs(ctx context.Context, c *qmp.Conn, in backupIntent) {
	for _, p := range in.Disks {
		_ = c.JobDismiss(ctx, backupJobID(p.Disk))
	}
}

func detachTargets(ctx context.Context, c *qmp.Conn, in backupIntent) {
	sets, _ := c.QueryFDSets(ctx)
	for _, p := range in.Disks {
		path := in.Dir + "/" + p.File
		_ = c.BlockdevDel(ctx, backupNode(path))
		_ = c.BlockdevDel(ctx, backupFile(path))
		for _, set := range sets {
			for _, fd := range set.FDs {
				if fd.Opaque == backupFDOpaque(path) {
					_ = c.RemoveFD(ctx, set.FDSetID, nil)
				}
			}
		}
	}
}

// start drops the chain's stale bitmaps, then starts every disk's job in
// one transaction with its new bitmap: one moment for all disks, and each
// bitmap begins at exactly the point its job copies. Completion mode is
// not grouped: QEMU 7.2 refuses it for bitmap actions; a failed job makes
// wait cancel the others.
func (b *backupRun) start(ctx context.Context) error {
	var actions []qmp.TransactionAction
	for _, p := range b.in.Disks {
		node, err := qdev.FindNode(ctx, b.c, p.Image)
		if err != nil {
			return fmt.Errorf("disk %q: %w", p.Disk, err)
		}
		for _, name := range p.Drop {
			if err := b.c.BlockDirtyBitmapRemove(ctx, node.NodeName, name); err != nil {
				return fmt.Errorf("disk %q: remove stale bitmap %s: %w", p.Disk, name, err)
			}
		}
		if p.NewBitmap != "" {
			actions = append(actions, qmp.BitmapAddAction(qmp.BitmapAdd{Node: node.NodeName, Name: p.NewBitmap, Persistent: true}))
		}
		job := qmp.Backup{JobID: backupJobID(p.Disk), Device: node.NodeName, Target: backupNode(b.path(p)),
			Sync: "full", AutoDismiss: new(bool)}
		if p.Mode == backupchain.Incremental {
			// "never": the previous point's bitmap stays as it is until the
			// manifest has this point, so a failure anywhere before leaves
			// it usable (the new one records from this point on).
			job.Sync, job.Bitmap, job.BitmapMode = "bitmap", p.Since, "never"
		}
		actions = append(actions, qmp.BackupAction(job))
	}
	// The point is the transaction's moment: the guest's filesystems are
	// frozen around it (as for a snapshot), and thawed whatever happened.
	q := b.s.quiesce(ctx, b.c, b.name, b.op)
	b.quiesced = q.How
	err := b.c.Transaction(ctx, actions, false)
	terr := q.Thaw()
	if err != nil {
		return errors.Join(fmt.Errorf("transaction: %w", err), terr)
	}
	return terr
}

// abort cancels the point's jobs and removes its new bitmaps.
func (b *backupRun) abort(ctx context.Context) { abortJobs(ctx, b.c, b.in) }

func abortJobs(ctx context.Context, c *qmp.Conn, in backupIntent) {
	jobs, _ := c.QueryJobs(ctx)
	for _, p := range in.Disks {
		id := backupJobID(p.Disk)
		for _, j := range jobs {
			if j.ID != id {
				continue
			}
			if !j.Ended() {
				_ = c.JobCancel(ctx, id)
				_, _ = qmp.WaitJob(ctx, c, id, nil, nil)
			}
			_ = c.JobDismiss(ctx, id)
		}
		if p.NewBitmap != "" {
			if n, err := qdev.FindNode(ctx, c, p.Image); err == nil {
				_ = c.BlockDirtyBitmapRemove(ctx, n.NodeName, p.NewBitmap)
			}
		}
	}
}

// wait waits for every job to conclude, reporting progress; the first
// that fails fails the point (the start step's undo cancels the others).
func (b *backupRun) wait(ctx context.Context) error {
	start := time.Now()
	for {
		jobs, err := b.c.QueryJobs(ctx)
		if err != nil {
			return err
		}
		var pr BackupProgress
		running := 0
		b.points = b.points[:0]
		for i, p := range b.in.Disks {
			j, ok := jobByID(jobs, backupJobID(p.Disk))
			switch {
			case !ok:
				return fmt.Errorf("disk %q: job %s vanished", p.Disk, backupJobID(p.Disk))
			case j.Ended() && j.Error != "":
				return fmt.Errorf("disk %q: %s", p.Disk, j.Error)
			case !j.Ended():
				running++
			}
			pr.Done, pr.Total = pr.Done+j.CurrentProgress, pr.Total+j.TotalProgress
			b.points = append(b.points, b.pointOf(i, j.TotalProgress))
		}
		pr.Elapsed = time.Since(start)
		if b.opts.Progress != nil {
			b.opts.Progress(pr)
		}
		if running == 0 {
			return nil
		}
		// Often at first (a small incremental point ends in milliseconds),
		// then every 200 ms.
		every := 20 * time.Millisecond
		if pr.Elapsed > 2*time.Second {
			every = 200 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}

func jobByID(jobs []qmp.Job, id string) (qmp.Job, bool) {
	for _, j := range jobs {
		if j.ID == id {
			return j, true
		}
	}
	return qmp.Job{}, false
}

// dropOldBitmaps removes the chain's bitmaps other than this point's, once
// the manifest has it: only the newest can serve the next point.
func (b *backupRun) dropOldBitmaps(ctx context.Context) error {
	for _, p := range b.in.Disks {
		if err := dropChainBitmaps(ctx, b.c, p, b.in.Chain); err != nil {
			b.s.env.Opts().Logger.Warn("backup: old bitmaps", "vm", b.name, "disk", p.Disk, "err", err)
		}
	}
	return nil
}

func dropChainBitmaps(ctx context.Context, c *qmp.Conn, p backupchain.DiskPlan, chain string) error {
	n, err := qdev.FindNode(ctx, c, p.Image)
	if err != nil {
		return err
	}
	var errs []error
	for _, bm := range n.DirtyBitmaps {
		if strings.HasPrefix(bm.Name, backupchain.BitmapPrefix(chain)) && bm.Name != p.NewBitmap {
			errs = append(errs, c.BlockDirtyBitmapRemove(ctx, n.NodeName, bm.Name))
		}
	}
	return errors.Join(errs...)
}

// freeBytes is what an unprivileged writer may still write into dir.
func freeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}
