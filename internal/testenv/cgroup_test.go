package testenv

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// TestBesideCgroup: the bench's raw QEMU baseline has a cgroup beside the
// sandbox's, made once and joined by each raw QEMU in turn (empty between
// them), outside the tree the sandbox's systemd owns: inside it, that
// systemd removed the directory and the baseline failed to join on the
// hosts of issue 35. That removal does not happen on every host (not on
// the one this test was written on), so the placement check is what fails
// when the cgroup goes back inside; the join and the clean-up are checked
// on every host.
func TestBesideCgroup(t *testing.T) {
	ctx, sd, conn := ownSandbox(t)
	t.Logf("cgroup layout: %s", layoutName(sd.cg))
	dir, err := sd.BesideCgroup("cpu")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range sd.cg.all {
		if inside := filepath.Join(m, sd.Cgroup); dir == inside || strings.HasPrefix(dir, inside+"/") {
			t.Fatalf("BesideCgroup = %s, inside the sandbox's tree %s", dir, inside)
		}
	}
	const unit = "vmsup-testenv-cpu.service"
	ch := make(chan string, 1)
	props := []sdbus.Property{
		sdbus.PropExecStart([]string{"/bin/sleep", "30"}, false),
		{Name: "CPUAccounting", Value: godbus.MakeVariant(true)},
		{Name: "CPUWeight", Value: godbus.MakeVariant(uint64(200))},
	}
	if _, err := conn.StartTransientUnitContext(ctx, unit, "fail", props, ch); err != nil || <-ch != "done" {
		t.Fatalf("start %s: %v", unit, err)
	}
	sleeper := exec.Command("/bin/sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleeper.Process.Kill(); sleeper.Wait() }()
	pid := strconv.Itoa(sleeper.Process.Pid)
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(pid), 0o644); err != nil {
		t.Fatalf("move the baseline's process into %s: %v", dir, err)
	}

	in, err := procs(dir)
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	if !slices.Contains(in, sleeper.Process.Pid) {
		t.Fatalf("process %s is not in %s (procs: %v)", pid, dir, in)
	}

	sleeper.Process.Kill()
	sleeper.Wait()
	if err := sd.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stop left the baseline's cgroup %s (%v)", dir, err)
	}
}

// layoutName says which cgroup layout the host has, for the test's log
// (the sandbox refuses a pure v2 host: see readMounts).
func layoutName(c *cgroupTree) string {
	if _, unified := c.mounts["unified"]; unified {
		return "hybrid (v1 controllers beside a v2 tree)"
	}
	return "v1"
}
