package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/dev/bench"
	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// snapshots measures, on one test guest (TCG) with a qcow2 data disk and
// its guest agent: the pause a disk-only snapshot makes the guest see
// (fsfreeze to thaw, the transaction between), a memory snapshot's pause,
// and `up --from-snapshot` of a clone to a console answer against a cold
// boot of the same guest to the same answer.
func (f *fixture) snapshots(ctx context.Context) error {
	const secPause, secClone = "7. snapshots (test guest, TCG)", "8. clone from a memory snapshot (test guest, TCG)"
	dir := filepath.Join(f.dir, "snap")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	body := fmt.Sprintf(`name = "snap"
memory = "256M"
accel = "tcg"
stop_timeout = "20s"

[[disk]]
name = "data"
file = %q
size = "64M"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0"
`, filepath.Join(dir, "data.qcow2"), f.guest.kernel, f.guest.initrd)
	path := filepath.Join(dir, "snap.toml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		return err
	}
	vm, err := spec.Load(path)
	if err != nil {
		return err
	}
	// 48 MiB of data on the 64 MiB disk, for the backup figure.
	if err := fillImage(ctx, filepath.Join(dir, "data.qcow2"), 64, 48); err != nil {
		return err
	}
	sup, reps := f.sup, max(f.cfg.bootReps, 3)
	defer func() {
		dctx := context.WithoutCancel(ctx)
		for i := range reps {
			sup.Down(dctx, fmt.Sprintf("clone%d", i))
			sup.Remove(dctx, fmt.Sprintf("clone%d", i))
		}
		sup.Down(dctx, "snap")
		sup.Remove(dctx, "snap")
	}()
	cold, err := coldBoots(ctx, sup, vm, reps)
	if err != nil {
		return err
	}
	if err := waitAgentAnswers(ctx, sup, "snap"); err != nil {
		return err
	}
	if err := f.backupFigures(ctx, sup, dir, reps); err != nil {
		return err
	}
	var pauses []float64
	quiesced := ""
	for i := range 2 * reps {
		r, err := sup.Snapshot(ctx, "snap", fmt.Sprintf("s%d", i), supervisor.SnapshotOptions{})
		if err != nil {
			return err
		}
		pauses, quiesced = append(pauses, ms(r.Pause)), r.Quiesced
	}
	m, err := sup.Snapshot(ctx, "snap", "warm", supervisor.SnapshotOptions{Memory: true})
	if err != nil {
		return err
	}
	warm, err := clones(ctx, sup, reps)
	if err != nil {
		return err
	}
	r := f.report
	r.Add(bench.Row{Section: secPause, Figure: "disk-only snapshot: guest-visible pause", Variant: vAPI, Accel: "tcg", Unit: "ms",
		Summary: bench.Summarize(pauses), Limit: 50, Note: "one qcow2 disk; " + quiesced + "; fsfreeze to thaw"})
	r.Add(bench.Row{Section: secPause, Figure: "memory snapshot: guest paused", Variant: vAPI, Accel: "tcg", Unit: "ms",
		Summary: bench.Summarize([]float64{ms(m.Pause)}), Note: "256 MiB guest; RAM saved to a file while paused"})
	r.Add(bench.Row{Section: secClone, Figure: "up to the console's answer", Variant: "cold boot", Accel: "tcg", Unit: "ms",
		Summary: bench.Summarize(cold), Note: "vmsup up, boot, shell answers"})
	r.Add(bench.Row{Section: secClone, Figure: "up to the console's answer", Variant: "up --from-snapshot", Accel: "tcg", Unit: "ms",
		Summary: bench.Summarize(warm), Baseline: "cold boot", Target: 0.25, Note: "overlays made, state read from the file, guest resumed"})
	return nil
}

// coldBoots times up to the console's answer, reps times; the VM stays
// up after the last.
func coldBoots(ctx context.Context, sup *supervisor.Supervisor, vm *spec.File, reps int) ([]float64, error) {
	var cold []float64
	for i := range reps {
		start := time.Now()
		if _, err := sup.Up(ctx, vm); err != nil {
			return nil, err
		}
		if err := consoleAnswers(ctx, sup, vm.VM.Name, true); err != nil {
			return nil, err
		}
		cold = append(cold, ms(time.Since(start)))
		if i < reps-1 {
			if _, err := sup.Down(ctx, vm.VM.Name); err != nil {
				return nil, err
			}
		}
	}
	return cold, nil
}

// clones times up --from-snapshot snap:warm to the clone's console
// answer, reps times, each clone removed after.
func clones(ctx context.Context, sup *supervisor.Supervisor, reps int) ([]float64, error) {
	var warm []float64
	for i := range reps {
		name := fmt.Sprintf("clone%d", i)
		start := time.Now()
		if _, err := sup.UpFromSnapshot(ctx, "snap", "warm", name); err != nil {
			return nil, err
		}
		if err := consoleAnswers(ctx, sup, name, false); err != nil {
			return nil, err
		}
		warm = append(warm, ms(time.Since(start)))
		sup.Down(ctx, name)
		sup.Remove(ctx, name)
	}
	return warm, nil
}

// consoleAnswers waits until the VM's console shell answers a command; a
// booting guest's shell first prints its marker (a restored one waits at
// its prompt already).
func consoleAnswers(ctx context.Context, sup *supervisor.Supervisor, name string, boots bool) error {
	st, err := sup.Status(ctx, name)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for boots {
		if b, _ := os.ReadFile(st.ConsoleLog); strings.Contains(string(b), testenv.ShellMarker) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: no shell marker: %w", name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	sh, err := testenv.DialConsole(ctx, st.Console)
	if err != nil {
		return err
	}
	defer sh.Close()
	out, _, err := sh.Run(ctx, "echo READY-$((6*7))")
	if err == nil && !strings.Contains(out, "READY-42") {
		err = fmt.Errorf("%s: console answered %q", name, out)
	}
	return err
}

func waitAgentAnswers(ctx context.Context, sup *supervisor.Supervisor, name string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := sup.GuestPing(ctx, name)
		if err == nil && st.Error == "" {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New(st.Error)
			}
			return fmt.Errorf("%s: guest agent: %w", name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// fillImage makes a qcow2 image of sizeMiB with dataMiB of data written.
func fillImage(ctx context.Context, path string, sizeMiB, dataMiB int) error {
	os.Remove(path)
	for _, args := range [][]string{
		{"qemu-img", "create", "-q", "-f", "qcow2", path, fmt.Sprintf("%dM", sizeMiB)},
		{"qemu-io", "-f", "qcow2", "-c", fmt.Sprintf("write -P 0xa5 0 %dM", dataMiB), path},
	} {
		if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v: %s", args[0], err, out)
		}
	}
	return nil
}

// backupFigures: a full live backup of the running VM's data disk against
// qemu-img convert of the same image, each from a cold page cache.
func (f *fixture) backupFigures(ctx context.Context, sup *supervisor.Supervisor, dir string, reps int) error {
	const sec = "9. backup (test guest, TCG; 48 MiB of data in a 64 MiB qcow2)"
	var live, conv []float64
	for i := range reps {
		dropCaches()
		r, err := sup.Backup(ctx, "snap", supervisor.BackupOptions{Dir: filepath.Join(dir, fmt.Sprintf("backup%d", i))})
		if err != nil {
			return err
		}
		var copied int64
		for _, d := range r.Disks {
			copied += d.Copied
		}
		live = append(live, float64(copied)/(1<<20)/r.Duration.Seconds())
		out := filepath.Join(dir, fmt.Sprintf("convert%d.qcow2", i))
		dropCaches()
		start := time.Now()
		if b, err := exec.CommandContext(ctx, "qemu-img", "convert", "-U", "-O", "qcow2", filepath.Join(dir, "data.qcow2"), out).CombinedOutput(); err != nil {
			return fmt.Errorf("qemu-img convert: %v: %s", err, b)
		}
		conv = append(conv, 48/time.Since(start).Seconds())
		os.Remove(out)
	}
	r := f.report
	r.Add(bench.Row{Section: sec, Figure: "full copy throughput", Variant: "qemu-img convert", Accel: "-", Unit: "MiB/s",
		Summary: bench.Summarize(conv), Note: "qemu-img convert -U of the running VM's image to a new qcow2"})
	r.Add(bench.Row{Section: sec, Figure: "full copy throughput", Variant: "vmsup backup (live)", Accel: "tcg", Unit: "MiB/s",
		Summary: bench.Summarize(live), Baseline: "qemu-img convert",
		Note: "the whole Backup call: files, fd sets, nodes, blockdev-backup, checksums, manifest; the guest runs"})
	return nil
}

// dropCaches empties the page cache, so that both copies read the disk.
func dropCaches() {
	exec.Command("sync").Run()
	_ = os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200)
}
