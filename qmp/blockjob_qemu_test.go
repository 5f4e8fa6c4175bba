package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Block jobs, bitmaps and NBD exports against a real QEMU 7.2 (TCG, paused,
// no guest OS): data is written through HMP's qemu-io.

// qemuImg runs qemu-img and returns its stdout.
func qemuImg(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skipf("needs qemu-img in PATH: %v", err)
	}
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("qemu-img %s: %v: %s", strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// qcow2Node is blockdev-add's argument for a qcow2 image in a file.
// Backing "null" opens it without its backing file, as blockdev-snapshot
// wants an overlay.
type qcow2Node struct {
	Driver   string          `json:"driver"`
	NodeName string          `json:"node-name"`
	File     fileRef         `json:"file"`
	Backing  json.RawMessage `json:"backing,omitempty"`
}

type fileRef struct {
	Driver   string `json:"driver"`
	Filename string `json:"filename"`
}

func addQcow2(t *testing.T, c *Conn, node, path string, noBacking bool) {
	t.Helper()
	n := qcow2Node{Driver: "qcow2", NodeName: node, File: fileRef{"file", path}}
	if noBacking {
		n.Backing = json.RawMessage("null")
	}
	if err := c.BlockdevAdd(context.Background(), n); err != nil {
		t.Fatalf("blockdev-add %s: %v", node, err)
	}
}

// diskQEMU starts QEMU with a qcow2 image of size as node "base" behind
// virtio-blk device "disk0".
func diskQEMU(t *testing.T, size string) (*qemuProc, *Conn, string) {
	t.Helper()
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", base, size)
	q := startQEMU(t,
		"-blockdev", "driver=file,node-name=base-file,filename="+base,
		"-blockdev", "driver=qcow2,node-name=base,file=base-file",
		"-device", "virtio-blk-pci,drive=base,id=disk0")
	return q, dialQEMU(t, q), base
}

// qemuIO runs a qemu-io command through HMP on device disk0 (as the guest
// would write) or on a node (through a BlockBackend of its own: reads, or
// nodes no device uses).
func qemuIO(t *testing.T, c *Conn, target, cmd string) string {
	t.Helper()
	line := "qemu-io " + target + ` "` + cmd + `"`
	if target == "disk0" {
		// -d disk0 fails ("Device does not have a block device backend"):
		// the backend belongs to virtio-blk-pci's inner device.
		line = `qemu-io -d /machine/peripheral/disk0/virtio-backend "` + cmd + `"`
	}
	out, err := c.HumanMonitorCommand(context.Background(), line)
	if err != nil || strings.Contains(out, "rror") {
		t.Fatalf("%s: %q, %v", line, out, err)
	}
	return out
}

func insertedNode(t *testing.T, c *Conn) string {
	t.Helper()
	bs, err := c.QueryBlock(context.Background())
	if err != nil || len(bs) != 1 || bs[0].Inserted == nil {
		t.Fatalf("QueryBlock = %+v, %v; want one device with a medium", bs, err)
	}
	return bs[0].Inserted.NodeName
}

func ptr[T any](v T) *T { return &v }

func isStatus(s JobStatus) func(Job) bool { return func(j Job) bool { return j.Status == s } }

// statusLog records the statuses a job went through, once each.
type statusLog []JobStatus

func (l *statusLog) see(j Job) {
	if len(*l) == 0 || (*l)[len(*l)-1] != j.Status {
		*l = append(*l, j.Status)
	}
}

// An external snapshot through a transaction, then an active commit of the
// overlay back into the base, pivoting the device back to it.
func TestQEMUSnapshotCommit(t *testing.T) {
	t.Parallel()
	_, c, base := diskQEMU(t, "4M")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	qemuIO(t, c, "disk0", "write -P 0x11 0 64k")

	overlay := filepath.Join(filepath.Dir(base), "overlay.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, "-u", overlay, "4M")
	addQcow2(t, c, "ov", overlay, true)
	if err := c.Transaction(ctx, []TransactionAction{SnapshotAction("base", "ov")}, false); err != nil {
		t.Fatalf("Transaction: %v", err)
	}
	if n := insertedNode(t, c); n != "ov" {
		t.Fatalf("device on node %q after the snapshot, want ov", n)
	}
	qemuIO(t, c, "disk0", "write -P 0x22 64k 64k")

	start := time.Now()
	if err := c.BlockCommit(ctx, Commit{JobID: "commit0", Device: "ov", BaseNode: "base", AutoDismiss: ptr(false)}); err != nil {
		t.Fatalf("BlockCommit: %v", err)
	}
	var seen statusLog
	j, err := WaitJob(ctx, c, "commit0", isStatus("ready"), seen.see)
	if err != nil {
		t.Fatalf("WaitJob ready: %v", err)
	}
	t.Logf("active commit ready after %v: %+v", time.Since(start), j)
	if err := c.JobComplete(ctx, "commit0"); err != nil {
		t.Fatalf("JobComplete: %v", err)
	}
	if j, err = WaitJob(ctx, c, "commit0", nil, seen.see); err != nil || j.Type != "commit" {
		t.Fatalf("WaitJob concluded = %+v, %v", j, err)
	}
	t.Logf("commit0 statuses %v, %v in all", seen, time.Since(start))
	if err := c.JobDismiss(ctx, "commit0"); err != nil {
		t.Fatalf("JobDismiss: %v", err)
	}
	if jobs, err := c.QueryJobs(ctx); err != nil || len(jobs) != 0 {
		t.Errorf("QueryJobs after dismiss = %+v, %v", jobs, err)
	}
	if n := insertedNode(t, c); n != "base" {
		t.Errorf("device on node %q after the commit, want base", n)
	}
	// The overlay's write is now in the base.
	qemuIO(t, c, "base", "read -P 0x22 64k 64k")
	qemuIO(t, c, "base", "read -P 0x11 0 64k")
}

// A mirror to a new node reaches ready; block-job-cancel without force then
// completes it without a pivot: the device stays on the source and the
// target is a full copy. With force it is a real cancel.
func TestQEMUMirrorCancel(t *testing.T) {
	t.Parallel()
	q, c, base := diskQEMU(t, "4M")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	qemuIO(t, c, "disk0", "write -P 0x33 0 1M")
	dir := filepath.Dir(base)
	targets := []string{filepath.Join(dir, "copy.qcow2"), filepath.Join(dir, "forced.qcow2")}
	for i, path := range targets {
		qemuImg(t, "create", "-q", "-f", "qcow2", path, "4M")
		addQcow2(t, c, []string{"copy", "forced"}[i], path, false)
	}

	mirror := func(id, target string) {
		t.Helper()
		start := time.Now()
		if err := c.BlockdevMirror(ctx, Mirror{JobID: id, Device: "base", Target: target, Sync: "full", AutoDismiss: ptr(false)}); err != nil {
			t.Fatalf("BlockdevMirror %s: %v", id, err)
		}
		j, err := WaitJob(ctx, c, id, isStatus("ready"), nil)
		if err != nil {
			t.Fatalf("WaitJob %s ready: %v", id, err)
		}
		t.Logf("mirror %s ready after %v: %+v", id, time.Since(start), j)
	}

	mirror("m0", "copy")
	if err := c.BlockJobCancel(ctx, "m0", false); err != nil {
		t.Fatalf("BlockJobCancel: %v", err)
	}
	j, err := WaitJob(ctx, c, "m0", nil, nil)
	if err != nil || j.Error != "" {
		t.Fatalf("WaitJob after cancel on ready = %+v, %v; want concluded without error", j, err)
	}
	if n := insertedNode(t, c); n != "base" {
		t.Errorf("device on node %q after cancelling a ready mirror, want base (no pivot)", n)
	}
	if err := c.JobDismiss(ctx, "m0"); err != nil {
		t.Fatalf("JobDismiss: %v", err)
	}

	mirror("m1", "forced")
	if err := c.BlockJobCancel(ctx, "m1", true); err != nil {
		t.Fatalf("BlockJobCancel force: %v", err)
	}
	j, err = WaitJob(ctx, c, "m1", nil, nil)
	var je *JobError
	if !errors.As(err, &je) || je.Job.Status != "concluded" || je.Reason != "Operation canceled" {
		t.Errorf("WaitJob after a forced cancel = %+v, %v; want concluded with QEMU's \"Operation canceled\"", j, err)
	}
	if n := insertedNode(t, c); n != "base" {
		t.Errorf("device on node %q after a forced cancel, want base", n)
	}

	if err := c.Quit(ctx); err != nil {
		t.Fatal(err)
	}
	<-q.exited
	if out := qemuImg(t, "compare", "-q", base, targets[0]); out != "" {
		t.Errorf("qemu-img compare: %s", out)
	}
}

// A persistent bitmap made with a full backup in one grouped transaction,
// then an incremental backup of what the guest wrote since; QEMU stores the
// bitmap in the image when it quits.
func TestQEMUPersistentBitmapBackup(t *testing.T) {
	t.Parallel()
	q, c, base := diskQEMU(t, "4M")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	qemuIO(t, c, "disk0", "write -P 0x11 0 1M")
	dir := filepath.Dir(base)
	full, incr := filepath.Join(dir, "full.qcow2"), filepath.Join(dir, "incr.qcow2")
	for _, p := range []string{full, incr} {
		qemuImg(t, "create", "-q", "-f", "qcow2", p, "4M")
	}
	addQcow2(t, c, "full", full, false)
	addQcow2(t, c, "incr", incr, false)

	actions := []TransactionAction{
		BackupAction(Backup{JobID: "full0", Device: "base", Target: "full", Sync: "full", AutoDismiss: ptr(false)}),
		BitmapAddAction(BitmapAdd{Node: "base", Name: "b0", Persistent: true}),
	}
	// QEMU 7.2 refuses grouped completion unless every action is a job,
	// and then nothing happened.
	err := c.Transaction(ctx, actions, true)
	if !IsClass(err, ClassGenericError) || !strings.Contains(err.Error(), "does not support Transaction property completion-mode") {
		t.Errorf("grouped Transaction with a bitmap action = %v, want refused", err)
	}
	if jobs, _ := c.QueryJobs(ctx); len(jobs) != 0 {
		t.Fatalf("refused transaction left jobs %+v", jobs)
	}
	start := time.Now()
	if err := c.Transaction(ctx, actions, false); err != nil {
		t.Fatalf("Transaction backup + bitmap: %v", err)
	}
	var seen statusLog
	if _, err := WaitJob(ctx, c, "full0", nil, seen.see); err != nil {
		t.Fatalf("WaitJob full0: %v", err)
	}
	t.Logf("full backup: statuses %v, %v", seen, time.Since(start))
	if err := c.JobDismiss(ctx, "full0"); err != nil {
		t.Fatal(err)
	}

	qemuIO(t, c, "disk0", "write -P 0x5a 2M 64k")
	if b := bitmapOf(t, c, "base", "b0"); b.Count != 64<<10 || !b.Persistent || !b.Recording {
		t.Errorf("bitmap after a 64 KiB write = %+v, want 64 KiB dirty, persistent, recording", b)
	}
	start = time.Now()
	incr0 := Backup{JobID: "incr0", Device: "base", Target: "incr", Sync: "incremental", Bitmap: "b0",
		AutoFinalize: ptr(false), AutoDismiss: ptr(false)}
	if err := c.BlockdevBackup(ctx, incr0); err != nil {
		t.Fatalf("BlockdevBackup incremental: %v", err)
	}
	// Without auto-finalize the job waits in "pending", bitmap untouched.
	if _, err := WaitJob(ctx, c, "incr0", isStatus("pending"), nil); err != nil {
		t.Fatalf("WaitJob incr0 pending: %v", err)
	}
	if b := bitmapOf(t, c, "base", "b0"); b.Count != 64<<10 || !b.Busy {
		t.Errorf("bitmap while the backup is pending = %+v, want still dirty and busy", b)
	}
	if err := c.JobFinalize(ctx, "incr0"); err != nil {
		t.Fatalf("JobFinalize: %v", err)
	}
	j, err := WaitJob(ctx, c, "incr0", nil, nil)
	if err != nil {
		t.Fatalf("WaitJob incr0: %v", err)
	}
	t.Logf("incremental backup: %+v, %v", j, time.Since(start))
	if err := c.JobDismiss(ctx, "incr0"); err != nil {
		t.Fatal(err)
	}
	if b := bitmapOf(t, c, "base", "b0"); b.Count != 0 {
		t.Errorf("bitmap after the incremental backup = %+v, want cleared (sync incremental clears on success)", b)
	}
	// The incremental target holds only the dirty 64 KiB.
	qemuIO(t, c, "incr", "read -P 0x5a 2M 64k")

	if err := c.Quit(ctx); err != nil {
		t.Fatal(err)
	}
	<-q.exited
	var info struct {
		FormatSpecific struct {
			Data struct {
				Bitmaps []struct {
					Name        string   `json:"name"`
					Flags       []string `json:"flags"`
					Granularity int64    `json:"granularity"`
				} `json:"bitmaps"`
			} `json:"data"`
		} `json:"format-specific"`
	}
	out := qemuImg(t, "info", "--output=json", base)
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatal(err)
	}
	bs := info.FormatSpecific.Data.Bitmaps
	if len(bs) != 1 || bs[0].Name != "b0" {
		t.Errorf("qemu-img info bitmaps = %+v, want b0\n%s", bs, out)
	}
	t.Logf("bitmaps in the image after quit: %+v", bs)
	if n := allocated(t, incr); n != 64<<10 {
		t.Errorf("incremental target holds %d bytes, want 64 KiB", n)
	}
}

// bitmapOf returns node's bitmap name from query-named-block-nodes.
func bitmapOf(t *testing.T, c *Conn, node, name string) DirtyBitmap {
	t.Helper()
	nodes, err := c.QueryNamedBlockNodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		for _, b := range n.DirtyBitmaps {
			if n.NodeName == node && b.Name == name {
				return b
			}
		}
	}
	t.Fatalf("no bitmap %s on node %s in %+v", name, node, nodes)
	return DirtyBitmap{}
}

// mapExtent is one entry of qemu-img map --output=json.
type mapExtent struct {
	Start  int64 `json:"start"`
	Length int64 `json:"length"`
	Data   bool  `json:"data"`
	Zero   bool  `json:"zero"`
}

// allocated returns how many bytes of the image at path hold data.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var ex []mapExtent
	if err := json.Unmarshal([]byte(qemuImg(t, "map", "--output=json", path)), &ex); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range ex {
		if e.Data {
			n += e.Length
		}
	}
	return n
}

// A rate-limited stream with QEMU's default auto-dismiss: WaitJob learns
// its success from BLOCK_JOB_COMPLETED once query-jobs no longer lists it.
func TestQEMUStreamAutoDismiss(t *testing.T) {
	t.Parallel()
	_, c, base := diskQEMU(t, "4M")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	qemuIO(t, c, "disk0", "write -P 0x11 0 1M")
	overlay := filepath.Join(filepath.Dir(base), "overlay.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, "-u", overlay, "4M")
	addQcow2(t, c, "ov", overlay, true)
	if err := c.BlockdevSnapshot(ctx, "base", "ov"); err != nil {
		t.Fatalf("BlockdevSnapshot: %v", err)
	}

	start := time.Now()
	// 1 MiB of data at 4 MiB/s: about 250 ms.
	if err := c.BlockStream(ctx, Stream{JobID: "s0", Device: "ov", Speed: 4 << 20}); err != nil {
		t.Fatalf("BlockStream: %v", err)
	}
	var seen statusLog
	polls := 0
	j, err := WaitJob(ctx, c, "s0", nil, func(j Job) { polls++; seen.see(j) })
	if err != nil || j.Status != "null" {
		t.Fatalf("WaitJob = %+v, %v; want success (status null) from the event", j, err)
	}
	t.Logf("stream: statuses %v over %d polls, %v", seen, polls, time.Since(start))
	if jobs, err := c.QueryJobs(ctx); err != nil || len(jobs) != 0 {
		t.Errorf("QueryJobs = %+v, %v; want none (auto-dismissed)", jobs, err)
	}
	nodes, err := c.QueryNamedBlockNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.NodeName == "ov" && n.BackingFile != "" {
			t.Errorf("overlay still backed by %s after the stream", n.BackingFile)
		}
	}
	qemuIO(t, c, "disk0", "read -P 0x11 0 1M")
}
