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
	"syscall"
	"testing"
	"time"

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

// TestCgroupEmptyCpusetLevel: a cpuset level left empty on the sandbox's
// path (by a run killed between its mkdir and its copy, or one racing this
// run for the same parent) made the sandbox's start fail with "echo: write
// error: No space left on device" (issue 53). The harness fills such a level
// from its parent and the sandbox's own join then works; a level it cannot
// fill is refused with a message naming it, and a join that still fails
// names the cgroup.
func TestCgroupEmptyCpusetLevel(t *testing.T) {
	SkipUnlessRoot(t)
	c := &cgroupTree{mounts: map[string]string{}, own: map[string]string{}}
	if err := c.readMounts(); err != nil {
		t.Skipf("no cgroup v1 layout here: %v", err)
	}
	m, ok := c.mounts["cpuset"]
	if !ok {
		t.Skip("no cgroup v1 cpuset hierarchy on this host: nothing can be left empty")
	}
	level := filepath.Join(m, "vmsup-emptylevel-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(level, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeTree(level, 5*time.Second) })
	// A new cpuset level is empty unless its parent clones; make sure.
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		if err := os.WriteFile(filepath.Join(level, f), []byte("\n"), 0o644); err != nil {
			t.Fatalf("empty %s: %v", f, err)
		}
	}

	// The failure as the sandbox met it: the harness's own join script, into
	// a cgroup below the empty level made as the harness did before (mkdir only).
	raw := filepath.Join(level, "raw")
	if err := os.Mkdir(raw, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := joinWithOuterScript([]string{filepath.Join(raw, "cgroup.procs")})
	if err == nil || !strings.Contains(out, "cannot join cgroup "+filepath.Join(raw, "cgroup.procs")) {
		t.Fatalf("joining below an empty cpuset: err %v, output %q; want a refusal naming the cgroup", err, out)
	}
	t.Logf("before the repair, the join is refused clearly: %s", strings.TrimSpace(out))
	syscall.Rmdir(raw)

	// The repair: the tree's mkdirAll fills the empty level it passes through.
	c.rel = filepath.Join(strings.TrimPrefix(level, m), "vmsup-test-"+strconv.Itoa(os.Getpid())+"-99")
	if err := c.mkdirAll(m, true); err != nil {
		t.Fatalf("mkdirAll through an empty cpuset level: %v", err)
	}
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		b, _ := os.ReadFile(filepath.Join(level, f))
		if len(strings.TrimSpace(string(b))) == 0 {
			t.Errorf("%s of %s still empty after mkdirAll", f, level)
		}
	}
	if out, err := joinWithOuterScript([]string{filepath.Join(m, c.rel, "cgroup.procs")}); err != nil {
		t.Fatalf("join after the repair: %v: %s", err, out)
	}

	// A level that cannot be filled (its parent is empty too) is refused by name.
	inner := filepath.Join(level, "inner")
	os.Mkdir(inner, 0o755)
	sub := filepath.Join(inner, "sub")
	os.Mkdir(sub, 0o755)
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		os.WriteFile(filepath.Join(sub, f), []byte("\n"), 0o644)
		os.WriteFile(filepath.Join(inner, f), []byte("\n"), 0o644)
	}
	err = cpusetFill(inner, sub)
	if err == nil || !strings.Contains(err.Error(), sub) || !strings.Contains(err.Error(), "is empty and so is its parent's") {
		t.Fatalf("cpusetFill below an empty parent = %v, want a refusal naming %s", err, sub)
	}
	t.Logf("refused: %v", err)
}

// joinWithOuterScript runs the sandbox's outer script (which joins the
// cgroups in procs, then unshares) with an inner step that just exits.
func joinWithOuterScript(procs []string) (string, error) {
	cmd := exec.Command("bash", "-c", outerScript, "vmsup-sandbox", "exit 0")
	cmd.Env = append(os.Environ(), "VMSUP_PROCS="+strings.Join(procs, "\n"), "VMSUP_UNSHARE_NET=")
	out, err := cmd.CombinedOutput()
	return string(out), err
}
