package livemigrate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/ops/migwire"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// Storage migration, the source's side: the disks the destination does not
// see (their marker) are copied while the guest runs, as libvirt's
// copy-storage does (qemuMigrationSrcNBDStorageCopy): the destination
// makes each image and exports it over its QEMU's NBD server, reached
// through a second relay (TLS, the stream's token); the source's QEMU
// mirrors each disk into an nbd node (blockdev-mirror, copy-mode
// write-blocking: a guest write completes once it reached both, so the
// copy converges under any write load). Once every copy is ready the RAM
// follows, with pause-before-switchover: there, the guest stopped and its
// I/O drained, each mirror is cancelled in the ready state (the target
// keeps a point-in-time copy; the source stays on its own images) and the
// nbd nodes go, then the stream goes on. Any failure before the switch
// leaves the guest running on its own disks.

// KindOutStorage is a migration to another host of a VM with local file
// disks the destination may take a copy of (its journal also names the
// copies, for the recovery's clean-up).
const KindOutStorage operation.Kind = "migrate-storage"

// Steps of the disks' copy on the source, as journaled.
const (
	stepMigDisksMirroring operation.Step = "migrate-disks-mirroring" // the copy jobs run
	stepMigDisksReady     operation.Step = "migrate-disks-ready"     // in sync: the RAM follows
	stepMigDisksDone      operation.Step = "migrate-disks-done"      // the jobs ended at the switch-over
)

// mirrorJob and mirrorTarget are the copy job and the nbd node of disk.
func mirrorJob(disk string) string {
	return "migm-" + strings.TrimPrefix(qemuargs.DiskNodeName(disk), "fmt-")
}

func mirrorTarget(disk string) string {
	return "migt-" + strings.TrimPrefix(qemuargs.DiskNodeName(disk), "fmt-")
}

// diskCandidates are the VM's disks a destination may take a copy of:
// writable file disks, with their format and size as the source's QEMU
// has them, and the stored image an overlay is on.
func (m *outgoing) diskCandidates(ctx context.Context) ([]migwire.DiskCopy, error) {
	var out []migwire.DiskCopy
	var nodes []qmp.BlockNode
	for i, d := range m.f.VM.Disks {
		if d.Type != spec.DiskFile || d.ReadOnly || !filepath.IsAbs(d.File) {
			continue
		}
		if nodes == nil {
			var err error
			if nodes, err = m.mon.QueryNamedBlockNodes(ctx); err != nil {
				return nil, fmt.Errorf("query-named-block-nodes: %w", err)
			}
		}
		c := migwire.DiskCopy{Name: d.Name, File: d.File, Format: d.Format}
		for _, n := range nodes {
			if n.NodeName == qemuargs.DiskNodeName(d.Name) {
				c.Format, c.Size = n.Driver, n.Image.VirtualSize
			}
		}
		if c.Size == 0 {
			return nil, fmt.Errorf("disk[%d] %q: no node %s in the source's QEMU", i, d.Name, qemuargs.DiskNodeName(d.Name))
		}
		if err := m.baseOf(d, &c); err != nil {
			return nil, fmt.Errorf("disk[%d] %q: %w", i, d.Name, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// mirror copies the disks the destination made (r.Disks) until every
// copy is in sync; the jobs then follow each guest write until the
// switch-over (endMirrors). On failure the guest runs on here, on its own
// disks.
func (m *outgoing) mirror(ctx context.Context, r migwire.Msg) error {
	if len(r.Disks) == 0 {
		return nil
	}
	m.copies = r.Disks
	m.res.Disks = len(r.Disks)
	addr, ok := strings.CutPrefix(r.NBD, "tcp:")
	if !ok {
		return m.fail("disks", "source", fmt.Errorf("destination gave NBD address %q, want tcp:HOST:PORT", r.NBD))
	}
	sock := filepath.Join(m.p.Dir, "nbd-out-"+migwire.RandHex(6)+".sock")
	m.in.NBDSock = sock
	for _, c := range r.Disks {
		m.in.Copies, m.in.CopyNames = append(m.in.Copies, c.File), append(m.in.CopyNames, c.Name)
	}
	if err := m.op.SetIntent(m.in); err != nil {
		return m.fail("disks", "source", err)
	}
	// The jobs and nodes go before the relay does (cleanups run newest
	// first), unless they ended at the switch-over.
	if err := m.nbdRelay(ctx, sock, addr, r); err != nil {
		return m.fail("disks", "source", err)
	}
	m.cleanups = append(m.cleanups, func() {
		if !m.mirrorsEnded && m.mon.Err() == nil {
			dropMirrors(context.WithoutCancel(ctx), m.mon, m.copies)
		}
	})
	t0 := time.Now()
	for _, c := range r.Disks {
		if err := m.startMirror(ctx, sock, c); err != nil {
			return m.fail("disks", "source", err)
		}
	}
	m.step(stepMigDisksMirroring)
	if err := m.awaitMirrors(ctx); err != nil {
		return m.fail("disks", "source", err)
	}
	m.res.DiskTime = time.Since(t0)
	m.step(stepMigDisksReady)
	return nil
}

// nbdRelay listens on sock for the source QEMU's nbd clients and relays
// each to the destination's NBD relay at addr (TLS pinned to its
// certificate, the stream's token).
func (m *outgoing) nbdRelay(ctx context.Context, sock, addr string, r migwire.Msg) error {
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	if err := vmstore.ChownLike(sock, m.p.Dir); err != nil {
		ln.Close()
		return err
	}
	dial := func() (net.Conn, error) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		c, err := m.o.Dial(dctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return migwire.DialTLS(dctx, c, r.CertPin)
	}
	relay := migwire.StartRelay(ln, dial, nil, migwire.SendToken(r.Token), m.mg.log)
	m.cleanups = append(m.cleanups, func() { relay.Close(); os.Remove(sock) })
	return nil
}

// startMirror adds disk c's nbd node and starts its copy job.
func (m *outgoing) startMirror(ctx context.Context, sock string, c migwire.DiskCopy) error {
	type server struct {
		Type string `json:"type"`
		Path string `json:"path"`
	}
	node := struct {
		Driver   string `json:"driver"`
		NodeName string `json:"node-name"`
		Server   server `json:"server"`
		Export   string `json:"export"`
	}{"nbd", mirrorTarget(c.Name), server{"unix", sock}, c.Export}
	if err := m.mon.BlockdevAdd(ctx, node); err != nil {
		return fmt.Errorf("disk %q: connect to the destination's copy: %w", c.Name, err)
	}
	noDismiss := false
	job := qmp.Mirror{JobID: mirrorJob(c.Name), Device: qemuargs.DiskNodeName(c.Name), Target: mirrorTarget(c.Name),
		Sync: c.Sync, CopyMode: "write-blocking", Speed: m.o.Bandwidth, AutoDismiss: &noDismiss}
	if err := m.mon.BlockdevMirror(ctx, job); err != nil {
		_ = m.mon.BlockdevDel(context.WithoutCancel(ctx), mirrorTarget(c.Name))
		return fmt.Errorf("disk %q: blockdev-mirror: %w", c.Name, err)
	}
	return nil
}

// errJobCancelled is QEMU's error of a job cancelled with force (7.2).
const errJobCancelled = "Operation canceled"

// awaitMirrors waits until every copy job is ready (in sync), reporting
// progress; the migration's timeout, stall timeout and cancel apply.
func (m *outgoing) awaitMirrors(ctx context.Context) error {
	// Polled often (a copy of a small disk is ready within milliseconds),
	// reported every ProgressInterval.
	tick := time.NewTicker(min(m.o.ProgressInterval, 50*time.Millisecond))
	defer tick.Stop()
	deadline := time.NewTimer(m.o.Timeout)
	defer deadline.Stop()
	last, moved, reported := int64(-1), time.Now(), time.Time{}
	for {
		jobs, err := m.mon.QueryJobs(ctx)
		if err != nil {
			return fmt.Errorf("query-jobs: %w", err)
		}
		ready, done, total, err := mirrorsState(jobs, m.copies)
		if err != nil {
			return err
		}
		m.res.DiskTransferred = done
		if m.o.Progress != nil && (ready || time.Since(reported) >= m.o.ProgressInterval) {
			m.o.Progress(migwire.Progress{Status: "disks", Elapsed: time.Since(m.start), DiskTransferred: done, DiskTotal: total})
			reported = time.Now()
		}
		if ready {
			return nil
		}
		if done != last {
			last, moved = done, time.Now()
		} else if time.Since(moved) > m.o.StallTimeout {
			return fmt.Errorf("disks: no progress for %s (network down?)", m.o.StallTimeout)
		}
		select {
		case <-ctx.Done():
			return migwire.ErrCancelled
		case <-deadline.C:
			return fmt.Errorf("disks: not in sync within %s", m.o.Timeout)
		case <-tick.C:
		}
	}
}

// mirrorsState reads the copies' jobs: all ready, their bytes sent and
// total, or the error of one that ended.
func mirrorsState(jobs []qmp.Job, copies []migwire.DiskCopy) (ready bool, done, total int64, err error) {
	ready = true
	for _, c := range copies {
		var j *qmp.Job
		for i := range jobs {
			if jobs[i].ID == mirrorJob(c.Name) {
				j = &jobs[i]
			}
		}
		switch {
		case j == nil:
			return false, 0, 0, fmt.Errorf("disk %q: its copy job %s is gone", c.Name, mirrorJob(c.Name))
		case j.Error == errJobCancelled:
			return false, 0, 0, migwire.ErrCancelled
		case j.Error != "" || j.Ended():
			return false, 0, 0, fmt.Errorf("disk %q: copy to the destination failed: %s", c.Name, cmpOr(j.Error, string(j.Status)))
		case j.Status != qmp.JobReady:
			ready = false
		}
		done += j.CurrentProgress
		total += j.TotalProgress
	}
	return ready, done, total, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// diskProgress adds the copies' figures to a progress report of the RAM.
func (m *outgoing) diskProgress(p *migwire.Progress) {
	if m.mirrorsEnded {
		p.DiskTransferred, p.DiskTotal = m.res.DiskTransferred, m.res.DiskTransferred
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), monitorCommandTimeout)
	defer cancel()
	if jobs, err := m.mon.QueryJobs(ctx); err == nil {
		if _, done, total, err := mirrorsState(jobs, m.copies); err == nil {
			m.res.DiskTransferred = done
			p.DiskTransferred, p.DiskTotal = done, total
		}
	}
}

// endMirrors runs at the switch-over, the guest stopped and its I/O
// drained: each ready job is cancelled, which completes it without a
// pivot (the destination's image is a copy as of now, the source keeps
// its own), then the nbd nodes go.
func (m *outgoing) endMirrors(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, finalizeTimeout)
	defer cancel()
	for _, c := range m.copies {
		if err := m.mon.BlockJobCancel(ctx, mirrorJob(c.Name), false); err != nil {
			return fmt.Errorf("disk %q: end the copy: %w", c.Name, err)
		}
	}
	var sent int64
	for _, c := range m.copies {
		j, err := qmp.WaitJob(ctx, m.mon, mirrorJob(c.Name), nil, nil)
		if err != nil {
			return fmt.Errorf("disk %q: end the copy: %w", c.Name, err)
		}
		sent += j.CurrentProgress
		_ = m.mon.JobDismiss(ctx, mirrorJob(c.Name))
		if err := m.mon.BlockdevDel(ctx, mirrorTarget(c.Name)); err != nil {
			return fmt.Errorf("disk %q: blockdev-del %s: %w", c.Name, mirrorTarget(c.Name), err)
		}
	}
	m.res.DiskTransferred = sent
	m.mirrorsEnded = true
	m.step(stepMigDisksDone)
	return nil
}

// dropMirrors cancels what is left of the copies' jobs and nodes on a
// source that keeps the guest (errors: there is nothing left).
func dropMirrors(ctx context.Context, mon *qmp.Conn, copies []migwire.DiskCopy) {
	ctx, cancel := context.WithTimeout(ctx, finalizeTimeout)
	defer cancel()
	for _, c := range copies {
		id := mirrorJob(c.Name)
		if err := mon.BlockJobCancel(ctx, id, true); err == nil {
			_, _ = qmp.WaitJob(ctx, mon, id, nil, nil)
		}
		_ = mon.JobDismiss(ctx, id)
		_ = mon.BlockdevDel(ctx, mirrorTarget(c.Name))
	}
}

// cancelMirrors cancels a migration's disk copy jobs (--cancel before the
// RAM streams): its vmsup sees them end cancelled and rolls back. n is how
// many it cancelled.
func cancelMirrors(ctx context.Context, c *qmp.Conn) (n int) {
	jobs, err := c.QueryJobs(ctx)
	if err != nil {
		return 0
	}
	for _, j := range jobs {
		if strings.HasPrefix(j.ID, "migm-") && !j.Ended() && c.BlockJobCancel(ctx, j.ID, true) == nil {
			n++
		}
	}
	return n
}

// removeSourceCopies removes this host's images of the disks copied to
// the destination, which runs the guest now (unless kept).
func (mg *Migrator) removeSourceCopies(name string, files []string, keep bool) string {
	if keep || len(files) == 0 {
		return ""
	}
	var errs []error
	for _, f := range files {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		mg.log.Warn("remove the disks copied to the destination", "vm", name, "err", err)
		return "the copied disks here could not all be removed: " + err.Error()
	}
	return fmt.Sprintf("its %d copied disk(s) here are removed", len(files))
}

// baseOf fills in what c's destination needs of disk d's base: a stored
// image's digest and where it was pulled from (the destination pulls it
// if its store lacks it), or the backing file the overlay names.
func (m *outgoing) baseOf(d spec.Disk, c *migwire.DiskCopy) error {
	switch {
	case d.Image != "":
		im, err := m.mg.env.Images().Store.Resolve(d.Image)
		if err != nil {
			return err
		}
		c.Image, c.ImageSource, c.ImageVerified = im.Digest, im.Source, im.Verified
	case d.Backing != "":
		c.Backing = d.Backing
	}
	return nil
}
