package supervisor_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/companion"
	"github.com/vmsup/vmsup/supervisor"
)

// TestLifecycle: up -> marker -> pause -> resume -> down by ACPI, on a real
// guest under real systemd; then systemctl stop powers it off gracefully too.
func TestLifecycle(t *testing.T) {
	ctx := ctxT(t, 3*time.Minute)
	dir := t.TempDir()
	sup := newSup(t, "")
	f := guestFile(t, dir, "life", "[[nic]]\nname = \"net0\"\n")

	t0 := time.Now()
	res, err := sup.Up(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].Action != supervisor.Started || res[0].Accel != "tcg" {
		t.Fatalf("up: %+v", res)
	}
	t.Logf("up returned after %s", time.Since(t0))
	st, err := sup.Status(ctx, "life")
	if err != nil || st.State != supervisor.StateRunning {
		t.Fatalf("status after up: %+v %v", st, err)
	}
	waitConsole(t, st, "VMSUP-GUEST-READY", 60*time.Second)
	t.Logf("guest marker after %s", time.Since(t0))
	checkPrivate(t, st.StateDir)

	// Idempotent: the same file again leaves the VM alone.
	res, err = sup.Up(ctx, f)
	if err != nil || res[0].Action != supervisor.Unchanged {
		t.Fatalf("second up: %+v %v", res, err)
	}
	st2, _ := sup.Status(ctx, "life")
	if st2.MainPID != st.MainPID {
		t.Fatalf("second up restarted QEMU: pid %d -> %d", st.MainPID, st2.MainPID)
	}

	if err := sup.Pause(ctx, "life"); err != nil {
		t.Fatal(err)
	}
	if st, _ := sup.Status(ctx, "life"); st.State != supervisor.StatePaused || st.QEMUStatus != "paused" {
		t.Fatalf("after pause: %+v", st)
	}
	if err := sup.Resume(ctx, "life"); err != nil {
		t.Fatal(err)
	}
	if st, _ := sup.Status(ctx, "life"); st.State != supervisor.StateRunning {
		t.Fatalf("after resume: %+v", st)
	}

	dr, err := sup.Down(ctx, "life")
	if err != nil {
		t.Fatal(err)
	}
	if dr.Step != supervisor.StoppedACPI {
		t.Fatalf("down ended by %q, want acpi", dr.Step)
	}
	t.Logf("down by %s in %s", dr.Step, dr.Duration)
	waitConsole(t, st, "reboot: Power down", 5*time.Second)
	if st, err := sup.Status(ctx, "life"); err != nil || st.State != supervisor.StateShutOff || st.UnitState != "" {
		t.Fatalf("after down: %+v %v", st, err)
	}
	if out, _ := env.Systemd.Systemctl(ctx, "is-active", "vmsup-life.service"); !strings.Contains(string(out), "inactive") {
		t.Fatalf("unit still there after down: %s", out)
	}
	// Down again: nothing to do, no error.
	if dr, err := sup.Down(ctx, "life"); err != nil || dr.Step != supervisor.StoppedAlready {
		t.Fatalf("second down: %+v %v", dr, err)
	}

	// systemctl stop runs the unit's ExecStop= hook: the same ACPI path.
	os.Remove(st.ConsoleLog)
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	waitConsole(t, st, "VMSUP-GUEST-READY", 60*time.Second)
	if out, err := env.Systemd.Systemctl(ctx, "stop", "vmsup-life.service"); err != nil {
		t.Fatalf("systemctl stop: %v\n%s", err, out)
	}
	waitConsole(t, st, "reboot: Power down", 5*time.Second)
	journal, _ := env.Systemd.Journal(ctx, "vmsup-life.service")
	if !strings.Contains(journal, "vmsup stop-hook life: acpi") {
		t.Fatalf("stop hook did not power the guest off by ACPI; journal:\n%s", tail(journal, 3000))
	}
	if st, _ := sup.Status(ctx, "life"); st.State != supervisor.StateShutOff {
		t.Fatalf("after systemctl stop: %+v", st)
	}
}

// TestCrash: kill -9 of QEMU shows as crashed with the signal; the next up works.
func TestCrash(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	sup := newSup(t, "")
	f := guestFile(t, t.TempDir(), "crash", "stop_timeout = \"2s\"")
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	pids := qemuPIDs(t, "crash")
	if len(pids) != 1 {
		t.Fatalf("want one QEMU process, got %v", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st := waitState(t, ctx, sup, "crash", supervisor.StateCrashed, 30*time.Second)
	if st.Reason != "killed by signal KILL" {
		t.Fatalf("after kill -9: %+v", st)
	}
	res, err := sup.Up(ctx, f)
	if err != nil {
		t.Fatalf("up after crash: %v", err)
	}
	if res[0].Action != supervisor.Started || !strings.Contains(res[0].Note, "killed by signal KILL") {
		t.Fatalf("up after crash: %+v", res[0])
	}
	if n := len(qemuPIDs(t, "crash")); n != 1 {
		t.Fatalf("%d QEMU processes after re-up", n)
	}
	// Kill again and go down from the crashed state: nothing stale is left.
	if err := syscall.Kill(qemuPIDs(t, "crash")[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st = waitState(t, ctx, sup, "crash", supervisor.StateCrashed, 30*time.Second)
	dr, err := sup.Down(ctx, "crash")
	if err != nil || dr.Step != supervisor.StoppedAlready || !strings.Contains(dr.Note, "killed by signal KILL") {
		t.Fatalf("down of a crashed VM: %+v %v", dr, err)
	}
	if socks, _ := filepath.Glob(filepath.Join(st.StateDir, "*.sock")); len(socks) != 0 {
		t.Fatalf("stale sockets after down: %v", socks)
	}
	if out, _ := env.Systemd.Systemctl(ctx, "list-units", "--all", "--no-legend", "vmsup-crash.service"); strings.TrimSpace(string(out)) != "" {
		t.Fatalf("unit left after down: %s", out)
	}
	if st, _ := sup.Status(ctx, "crash"); st.State != supervisor.StateShutOff {
		t.Fatalf("status after down: %+v", st)
	}
}

// checkPrivate: the state dir is 0700 and no socket or file in it is open to
// group or others.
func checkPrivate(t *testing.T, dir string) {
	t.Helper()
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("state dir %s: %v %v", dir, fi.Mode(), err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		info, _ := e.Info()
		if info.Mode().Type() == fs.ModeNamedPipe && info.Mode().Perm() == fs.FileMode(companion.FIFOMode(true)) {
			continue // the console's FIFO: root's, QEMU's user writes it as "others" (companion.FIFOMode)
		}
		if e.Name() == "boot" && e.IsDir() {
			// root's kernel and initrd copies, which QEMU's user reads as
			// "others": the state directory (its own, 0700) bounds them.
			continue
		}
		if info.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s/%s is %v: open to group/others", dir, e.Name(), info.Mode())
		}
	}
}

// TestConcurrentUp: two ups of one VM at once give one QEMU and one busy error.
func TestConcurrentUp(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	root := t.TempDir()
	f := guestFile(t, t.TempDir(), "twice", "stop_timeout = \"2s\"")
	a, b := newSup(t, root), newSup(t, root)
	type out struct {
		res []supervisor.UpResult
		err error
	}
	ch := make(chan out, 2)
	for _, s := range []*supervisor.Supervisor{a, b} {
		go func() {
			r, err := s.Up(ctx, f)
			ch <- out{r, err}
		}()
	}
	o1, o2 := <-ch, <-ch
	var busy *supervisor.BusyError
	var okOut out
	switch {
	case o1.err == nil && errors.As(o2.err, &busy):
		okOut = o1
	case o2.err == nil && errors.As(o1.err, &busy):
		okOut = o2
	default:
		t.Fatalf("want one success and one busy error, got %v / %v", o1.err, o2.err)
	}
	if okOut.res[0].Action != supervisor.Started {
		t.Fatalf("winner: %+v", okOut.res)
	}
	if !strings.Contains(busy.Error(), `vm "twice": busy: up by pid`) {
		t.Fatalf("busy error text: %q", busy.Error())
	}
	if n := len(qemuPIDs(t, "twice")); n != 1 {
		t.Fatalf("%d QEMU processes, want 1", n)
	}
	if _, err := a.Down(ctx, "twice"); err != nil {
		t.Fatal(err)
	}
}

// TestKVM: where the host probe says QEMU starts under KVM, a VM with accel
// "kvm" starts under KVM in its unit (DevicePolicy=closed with /dev/kvm
// allowed), with the CPU model and masks the probe found (an AMD host with
// PVM KVM needs arch-capabilities off for -cpu host), and status says so.
// No guest OS is needed: on PVM hosts a stock kernel does not boot, so it
// is stopped by quit.
func TestKVM(t *testing.T) {
	env.KVMSkip(t)
	ctx := ctxT(t, time.Minute)
	sup := newSup(t, "")
	f := guestFile(t, t.TempDir(), "kvm", "stop_timeout = \"1s\"")
	f.VM.Accel = "kvm"
	res, err := sup.Up(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Accel != "kvm" {
		t.Fatalf("accel %q", res[0].Accel)
	}
	reply, err := sup.QMP(ctx, "kvm", []byte(`{"execute":"query-kvm"}`), false)
	if err != nil || !strings.Contains(string(reply), `"enabled":true`) {
		t.Fatalf("query-kvm: %s %v", reply, err)
	}
	st, _ := sup.Status(ctx, "kvm")
	if st.Accel != "kvm" || st.State != supervisor.StateRunning {
		t.Fatalf("status: %+v", st)
	}
	model, masks, _ := env.Caps.CPU("kvm", "")
	if st.CPUModel != model || strings.Join(st.CPUMasks, ",") != strings.Join(masks, ",") {
		t.Fatalf("status says -cpu %s with %v off; the probe chose %s with %v", st.CPUModel, st.CPUMasks, model, masks)
	}
	_, autoWhy, _ := env.Caps.Accel("auto")
	t.Logf("KVM: %s, -cpu %s %v; auto would say: %q", reply, st.CPUModel, st.CPUMasks, autoWhy)
	if _, err := sup.Down(ctx, "kvm"); err != nil {
		t.Fatal(err)
	}
}
