package faultsnaptest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestFaultsSnapshots: the disk operations that rewrite which images a VM
// runs on, each killed after every step it journals and at random times:
// a full and an incremental backup, a live disk move, a snapshot (disk-only
// and with memory), its removal (live, and with the
// VM off), a revert (disk and memory) and a clone. After each kill the VM
// settles to one QEMU running the guest, with no block job, no export, no
// node on an image its view does not name, no deleted image held open, and
// the data the guest synced before the kill on its disk (or, after a
// revert that went through, the data of the snapshot); then the same
// operation succeeds.
func TestFaultsSnapshots(t *testing.T) {
	ctx := supervisortest.Context(t, 40*time.Minute)
	root := t.TempDir()
	a := supervisortest.NewSide(t, env, vmsupBin, "A", env.Systemd, root, filepath.Join(root, "etc-systemd"), nil)
	d := newSnapVM(t, ctx, a, root, "fsnap")
	var counts []string
	run := func(op supervisortest.FaultOp) {
		t.Run(op.Name, func(t *testing.T) {
			op.VM, op.Sides = d.vm, []*faultSide{a}
			if op.Random == 0 {
				op.Random = 2
			}
			if op.Check == nil {
				op.Check = d.check
			}
			n := supervisortest.RunFaults(t, ctx, op)
			counts = append(counts, fmt.Sprintf("%s %d+%d", op.Name, n.StepKills, n.RandomKills+n.RandomMissed))
		})
	}
	// Backups and a disk move first: they run on the disk's own image
	// (a move refuses a disk a snapshot put on an overlay).
	backups := filepath.Join(root, "backups")
	for _, incr := range []bool{false, true} {
		name := map[bool]string{false: "backup", true: "backup-incremental"}[incr]
		run(supervisortest.FaultOp{Name: name, Job: d.backupJob(backups, incr), Random: 1,
			Before: func(t *testing.T, ctx context.Context, _ *faultSide) { d.write(t, ctx) },
			Again: func(t *testing.T, ctx context.Context, _ *faultSide, _ supervisor.Status) {
				if _, err := d.sup.Backup(ctx, d.vm, supervisor.BackupOptions{Dir: backups, Incremental: incr}); err != nil {
					t.Fatalf("%s Again: %v", name, err)
				}
			}})
	}
	run(supervisortest.FaultOp{Name: "disk-move", Job: d.moveJob, Random: 1,
		Before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			d.write(t, ctx)
			d.moveTo = d.otherImage(t, ctx)
		},
		Again: func(t *testing.T, ctx context.Context, _ *faultSide, _ supervisor.Status) {
			if _, err := d.sup.MoveDisk(ctx, d.vm, "data", supervisor.MoveOptions{To: d.otherImage(t, ctx)}); err != nil {
				t.Fatalf("disk-move Again: %v", err)
			}
		}})
	run(supervisortest.FaultOp{Name: "snapshot", Job: d.job("snapshot", "k", false),
		Before: func(t *testing.T, ctx context.Context, _ *faultSide) { d.without(t, ctx, "k"); d.write(t, ctx) },
		Again: func(t *testing.T, ctx context.Context, _ *faultSide, _ supervisor.Status) {
			d.again(t, ctx, "k", false)
		}})
	run(supervisortest.FaultOp{Name: "snapshot-memory", Job: d.job("snapshot", "k", true),
		Before: func(t *testing.T, ctx context.Context, _ *faultSide) { d.without(t, ctx, "k"); d.write(t, ctx) },
		Again:  func(t *testing.T, ctx context.Context, _ *faultSide, _ supervisor.Status) { d.again(t, ctx, "k", true) }})
	run(supervisortest.FaultOp{Name: "snapshot-rm", Job: d.job("snapshot-rm", "k", false),
		Before: func(t *testing.T, ctx context.Context, _ *faultSide) { d.with(t, ctx, "k", false); d.write(t, ctx) },
		Again: func(t *testing.T, ctx context.Context, _ *faultSide, _ supervisor.Status) {
			d.with(t, ctx, "k", false) // (made again if the kill came after it went)
			d.remove(t, ctx, "k")
		}})
	t.Run("snapshot-rm-pivoted-then-stopped", func(t *testing.T) { d.removeKilledThenStopped(t, ctx, a) })
	run(supervisortest.FaultOp{Name: "snapshot-rm-off", Job: d.job("snapshot-rm", "k", false), Random: 1,
		Before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			d.with(t, ctx, "k", false)
			d.write(t, ctx)
			d.down(t, ctx)
		},
		Revive: d.up,
		Again: func(t *testing.T, ctx context.Context, _ *faultSide, _ supervisor.Status) {
			d.with(t, ctx, "k", false)
			d.remove(t, ctx, "k")
		}})
	for _, withRAM := range []bool{false, true} {
		tag, name := "r", "revert"
		if withRAM {
			tag, name = "m", "revert-memory"
		}
		run(supervisortest.FaultOp{Name: name, Job: d.job("revert", tag, false), Random: 1,
			Before: func(t *testing.T, ctx context.Context, _ *faultSide) {
				d.with(t, ctx, tag, withRAM)
				d.write(t, ctx)
				d.markRevert(t, ctx, tag)
			},
			Again: func(t *testing.T, ctx context.Context, _ *faultSide, _ supervisor.Status) {
				if _, err := d.sup.RevertSnapshot(ctx, d.vm, tag, true); err != nil {
					t.Fatalf("revert Again: %v", err)
				}
				d.afterRevert(t, ctx, tag)
			}})
	}
	run(supervisortest.FaultOp{Name: "clone", Job: d.cloneJob("c"), Random: 1,
		Before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			d.noClone(t, ctx)
			d.with(t, ctx, "c", true)
			d.write(t, ctx)
		},
		Again: func(t *testing.T, ctx context.Context, _ *faultSide, _ supervisor.Status) {
			d.checkClone(t, ctx, "c")
			d.noClone(t, ctx)
			if _, err := d.sup.UpFromSnapshot(ctx, d.vm, "c", d.vm+"-cl"); err != nil {
				t.Fatalf("clone Again: %v", err)
			}
			d.noClone(t, ctx)
		}})
	t.Run("clone-settled-by-its-name", func(t *testing.T) { d.cloneSettledByName(t, ctx, a) })
	t.Logf("FAULTS snapshots (step kills + random kills): %s", strings.Join(counts, ", "))
}

// snapVM is TestFaultsSnapshots's guest: a counter guest with a qcow2 data
// disk in the image directory, and the tokens it wrote there.
type snapVM struct {
	side   *faultSide
	sup    *supervisor.Supervisor
	vm     string
	file   string
	latest string            // the last token written (and synced)
	tokens map[string]string // the token each snapshot holds
	// image is the data disk's image before a revert; reverted, the
	// revert's outcome seen by the check (the disk on a new overlay).
	image    string
	revertOf string
	moveTo   string // the disk move's target image
	moves    int    // how many targets were named
}

func newSnapVM(t *testing.T, ctx context.Context, side *faultSide, root, vm string) *snapVM {
	t.Helper()
	images := filepath.Join(root, "images")
	if err := os.MkdirAll(images, 0o711); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, vm+".toml")
	supervisortest.WriteGuestTOML(t, env, path, vm, fmt.Sprintf("stop_timeout = \"5s\"\n[[disk]]\nname = \"data\"\nfile = %q\nsize = \"16M\"\n",
		filepath.Join(images, vm+"-data.qcow2")))
	b, _ := os.ReadFile(path)
	os.WriteFile(path, []byte(strings.Replace(string(b), `cmdline = "console=ttyS0 no_timer_check"`, `cmdline = "console=ttyS0 no_timer_check vmsup.counter"`, 1)), 0o644)
	d := &snapVM{side: side, sup: side.Sup, vm: vm, file: path, tokens: map[string]string{}}
	d.up(t, ctx, side)
	t.Cleanup(func() { d.sup.Kill(context.Background(), vm) })
	return d
}

func (d *snapVM) job(op, tag string, withRAM bool) func(*faultSide) faultJob {
	return func(on *faultSide) faultJob {
		j := on.Job
		j.Op, j.VM, j.Tag, j.WithRAM = op, d.vm, tag, withRAM
		return j
	}
}

func (d *snapVM) backupJob(dir string, incremental bool) func(*faultSide) faultJob {
	return func(on *faultSide) faultJob {
		j := d.job("backup", "", false)(on)
		j.Dir, j.Incremental = dir, incremental
		return j
	}
}

// moveJob moves the data disk to moveTo (Before sets it).
func (d *snapVM) moveJob(on *faultSide) faultJob {
	j := d.job("disk-move", "data", false)(on)
	j.Dir = d.moveTo
	return j
}

// otherImage is a new image beside the data disk's for a move to take it
// to (a move creates its target; the image it leaves stays).
func (d *snapVM) otherImage(t *testing.T, ctx context.Context) string {
	d.moves++
	return filepath.Join(filepath.Dir(d.dataImage(t, ctx)), fmt.Sprintf("%s-data-%d.qcow2", d.vm, d.moves))
}

func (d *snapVM) cloneJob(tag string) func(*faultSide) faultJob {
	return func(on *faultSide) faultJob {
		j := d.job("clone", tag, false)(on)
		j.NewName = d.vm + "-cl"
		return j
	}
}

// up starts the VM if it is not running and waits for its counter.
func (d *snapVM) up(t *testing.T, ctx context.Context, _ *faultSide) {
	t.Helper()
	if st, err := d.sup.Status(ctx, d.vm); err == nil && st.State == supervisor.StateRunning {
		return
	}
	f := supervisortest.LoadTOML(t, filepath.Dir(d.file), d.vm, mustRead(t, d.file))
	if _, err := d.sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	st, _ := d.sup.Status(ctx, d.vm)
	supervisortest.WaitCounterPast(t, st.ConsoleLog, 0, 2*time.Minute)
}

func (d *snapVM) down(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := d.sup.Down(ctx, d.vm); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (d *snapVM) console(t *testing.T, ctx context.Context) string {
	st, err := d.sup.Status(ctx, d.vm)
	if err != nil {
		t.Fatal(err)
	}
	return st.Console
}

// write writes a new token to the data disk, synced.
func (d *snapVM) write(t *testing.T, ctx context.Context) {
	t.Helper()
	d.latest = fmt.Sprintf("T%d", time.Now().UnixNano())
	supervisortest.WriteGuestData(t, ctx, d.console(t, ctx), d.latest)
}

// with makes sure snapshot tag exists (taken now, holding the token
// written last, if it does not).
func (d *snapVM) with(t *testing.T, ctx context.Context, tag string, withRAM bool) {
	t.Helper()
	if d.has(t, tag) {
		return
	}
	d.up(t, ctx, nil)
	if d.latest == "" {
		d.write(t, ctx)
	}
	if _, err := d.sup.Snapshot(ctx, d.vm, tag, supervisor.SnapshotOptions{Memory: withRAM}); err != nil {
		t.Fatalf("snapshot %s: %v", tag, err)
	}
	d.tokens[tag] = d.latest
}

// without makes sure snapshot tag does not exist.
func (d *snapVM) without(t *testing.T, ctx context.Context, tag string) {
	t.Helper()
	if d.has(t, tag) {
		d.remove(t, ctx, tag)
	}
}

func (d *snapVM) remove(t *testing.T, ctx context.Context, tag string) {
	t.Helper()
	if err := d.sup.RemoveSnapshot(ctx, d.vm, tag, nil); err != nil {
		t.Fatalf("remove snapshot %s: %v", tag, err)
	}
	delete(d.tokens, tag)
	d.noDeletedOverlay(t, ctx)
}

// noDeletedOverlay fails if the running QEMU has a node on an overlay file
// that is gone: a removal that took a merge for done (the overlay of a
// disk on descriptors went unfound once) deletes the file the guest still
// writes, and its writes are lost at the next start.
func (d *snapVM) noDeletedOverlay(t *testing.T, ctx context.Context) {
	t.Helper()
	if st, err := d.sup.Status(ctx, d.vm); err != nil || st.State != supervisor.StateRunning {
		return
	}
	var nodes []struct {
		NodeName string `json:"node-name"`
		File     string `json:"file"`
	}
	d.qmp(t, ctx, "query-named-block-nodes", &nodes)
	for _, n := range nodes {
		if !strings.HasPrefix(n.NodeName, "ovf-") {
			continue
		}
		if _, err := os.Stat(n.File); err != nil {
			t.Fatalf("after a snapshot's removal QEMU still has node %s on %s: %v", n.NodeName, n.File, err)
		}
	}
}

func (d *snapVM) has(t *testing.T, tag string) bool {
	tree, err := d.sup.SnapshotTree(d.vm)
	if err != nil {
		t.Fatal(err)
	}
	return tree.Find(tag) != nil
}

// again makes the snapshot again (it must succeed), then removes it.
func (d *snapVM) again(t *testing.T, ctx context.Context, tag string, withRAM bool) {
	t.Helper()
	d.without(t, ctx, tag)
	d.with(t, ctx, tag, withRAM)
	d.remove(t, ctx, tag)
}

// markRevert notes the image the data disk runs on before a revert to tag.
func (d *snapVM) markRevert(t *testing.T, ctx context.Context, tag string) {
	d.image, d.revertOf = d.dataImage(t, ctx), tag
}

// afterRevert: the disk holds the snapshot's token now.
func (d *snapVM) afterRevert(t *testing.T, ctx context.Context, tag string) {
	t.Helper()
	d.latest, d.image, d.revertOf = d.tokens[tag], "", ""
	st, _ := d.sup.Status(ctx, d.vm)
	supervisortest.WaitCounterPast(t, st.ConsoleLog, 0, 2*time.Minute)
	if got := supervisortest.ReadGuestData(t, ctx, d.console(t, ctx), len(d.latest)); got != d.latest {
		t.Fatalf("after a revert to %s the disk holds %q, want the snapshot's %q", tag, got, d.latest)
	}
}

func (d *snapVM) dataImage(t *testing.T, ctx context.Context) string {
	st, err := d.sup.Status(ctx, d.vm)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range st.Disks {
		if x.Name == "data" {
			return x.Image
		}
	}
	t.Fatalf("no data disk in %+v", st.Disks)
	return ""
}

// check is what every kill is checked for (see TestFaultsSnapshots).
func (d *snapVM) check(t *testing.T, ctx context.Context, on *faultSide, st supervisor.Status) {
	t.Helper()
	var jobs []struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	d.qmp(t, ctx, "query-jobs", &jobs)
	if len(jobs) > 0 {
		t.Fatalf("block jobs left: %+v", jobs)
	}
	var exports []struct {
		ID string `json:"id"`
	}
	d.qmp(t, ctx, "query-block-exports", &exports)
	if len(exports) > 0 {
		t.Fatalf("exports left: %+v", exports)
	}
	v, err := vmstore.Store{Root: on.Root}.View(d.vm)
	if err != nil {
		t.Fatal(err)
	}
	images := v.Images()
	var nodes []struct {
		NodeName string `json:"node-name"`
		Driver   string `json:"drv"`
		File     string `json:"file"`
	}
	d.qmp(t, ctx, "query-named-block-nodes", &nodes)
	files := d.fdSetFiles(t, ctx)
	for _, n := range nodes {
		if f, ok := files[n.File]; ok {
			n.File = f // a disk passed as descriptors: the image behind its fd set
		}
		if (n.Driver == "qcow2" || n.Driver == "file" || n.Driver == "raw") && strings.HasPrefix(n.File, "/") && !slices.Contains(images, n.File) {
			t.Fatalf("node %s (%s) on %s, which the VM's view does not name (%q)", n.NodeName, n.Driver, n.File, images)
		}
	}
	if pid := supervisortest.QEMUPID(on.SD, st.Unit); pid > 0 {
		fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
		for _, fd := range fds {
			if l, _ := os.Readlink(fd); strings.HasSuffix(l, " (deleted)") && !strings.HasPrefix(l, "/memfd:") {
				t.Fatalf("QEMU holds a deleted file open: %s", l)
			}
		}
	}
	want := []string{d.latest}
	if d.revertOf != "" && d.dataImage(t, ctx) != d.image {
		want = []string{d.tokens[d.revertOf]} // the revert went through
		d.latest = want[0]
	}
	if got := supervisortest.ReadGuestData(t, ctx, st.Console, len(want[0])); !slices.Contains(want, got) {
		t.Fatalf("the guest's synced data: the disk holds %q, want %q", got, want)
	}
}

// fdSetFiles maps each "/dev/fdset/N" to the image its descriptors are of,
// as vmsup's note on the fd set names it (query-fdsets is not in the raw
// QMP allow-list: the test asks with --unsafe).
func (d *snapVM) fdSetFiles(t *testing.T, ctx context.Context) map[string]string {
	t.Helper()
	b, err := d.sup.QMP(ctx, d.vm, []byte(`{"execute":"query-fdsets"}`), true)
	if err != nil {
		t.Fatalf("query-fdsets: %v", err)
	}
	var r struct {
		Return []struct {
			ID  int64 `json:"fdset-id"`
			FDs []struct {
				Opaque string `json:"opaque"`
			} `json:"fds"`
		} `json:"return"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, s := range r.Return {
		for _, f := range s.FDs {
			if path, ok := qdev.FDSetFile(f.Opaque); ok {
				files[fmt.Sprintf("/dev/fdset/%d", s.ID)] = path
			}
		}
	}
	return files
}

func (d *snapVM) qmp(t *testing.T, ctx context.Context, cmd string, out any) {
	t.Helper()
	b, err := d.sup.QMP(ctx, d.vm, []byte(`{"execute":"`+cmd+`"}`), false)
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	var r struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(r.Return, out); err != nil {
		t.Fatalf("%s: %v: %s", cmd, err, r.Return)
	}
}

// noClone makes sure the clone does not exist.
func (d *snapVM) noClone(t *testing.T, ctx context.Context) {
	t.Helper()
	name := d.vm + "-cl"
	if _, err := d.sup.Status(ctx, name); err == nil {
		d.sup.Kill(ctx, name)
		// --delete-disks: the clone's overlays are vmsup's, made for it
		// (a clone again under its name would find them: "file exists").
		if _, err := d.sup.RemoveDisks(ctx, name, true); err != nil {
			t.Fatalf("rm --delete-disks the clone: %v", err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(d.side.Root, "images", name+"-*")); len(left) > 0 {
		t.Fatalf("rm --delete-disks left the clone's images: %q", left)
	}
}

// checkClone: a clone a kill left is whole (running, its disk holding the
// snapshot's data) or it is not there at all.
func (d *snapVM) checkClone(t *testing.T, ctx context.Context, tag string) {
	t.Helper()
	name := d.vm + "-cl"
	st, err := d.sup.Status(ctx, name)
	if err != nil {
		return // not made
	}
	if st.State != supervisor.StateRunning {
		t.Fatalf("a half-made clone: %s (%s)", st.State, st.Reason)
	}
	if got := supervisortest.ReadGuestData(t, ctx, st.Console, len(d.tokens[tag])); got != d.tokens[tag] {
		t.Fatalf("the clone's disk holds %q, want the snapshot's %q", got, d.tokens[tag])
	}
}

// removeKilledThenStopped: a removal killed right after QEMU pivoted the
// disk onto the merged image, the guest writing there, then QEMU killed
// before any vmsup command ran: the next command must not merge the stale
// overlay over the guest's writes (the journal says it pivoted; QEMU's
// event log says the commit completed). (A status would recover while
// QEMU still runs: the writes after the kill go straight to the console.)
func (d *snapVM) removeKilledThenStopped(t *testing.T, ctx context.Context, on *faultSide) {
	d.up(t, ctx, on)
	d.with(t, ctx, "k", false)
	d.write(t, ctx)
	j := d.job("snapshot-rm", "k", false)(on)
	j.KillAfter = "pivoted data"
	if killed, out, _ := supervisortest.RunJob(t, ctx, j, 0); !killed {
		t.Fatalf("not killed after the pivot: %s", out)
	}
	d.latest = fmt.Sprintf("T%d", time.Now().UnixNano()) // onto the merged image
	supervisortest.WriteGuestData(t, ctx, filepath.Join(on.Root, "vms", d.vm, "console.sock"), d.latest)
	supervisortest.KillUnit(t, on.SD, "vmsup-"+d.vm+".service")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		st, err := d.sup.Status(ctx, d.vm) // recovers, QEMU gone
		if err == nil && (st.State == supervisor.StateCrashed || st.State == supervisor.StateShutOff) {
			t.Logf("QEMU killed after the pivot: %s; %s", st.State, st.Recovery)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("QEMU killed, the VM is still %s (%v)", st.State, err)
		}
	}
	d.up(t, ctx, on)
	if got := supervisortest.ReadGuestData(t, ctx, d.console(t, ctx), len(d.latest)); got != d.latest {
		t.Fatalf("after the restart the disk holds %q, want %q written after the pivot (the stale overlay was merged over it)", got, d.latest)
	}
	if d.has(t, "k") {
		t.Fatal("the snapshot was not removed")
	}
}
