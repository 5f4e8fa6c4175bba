package stats

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ownCgroupDir is the test process's cgroup v2 directory, from the "0::"
// line of /proc/self/cgroup under wherever cgroup2 is mounted.
func ownCgroupDir(t *testing.T) string {
	t.Helper()
	mnt, err := CgroupV2Mount()
	if err != nil {
		t.Skipf("no cgroup v2 hierarchy here: %v", err)
	}
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rel, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join(mnt, rel)
		}
	}
	t.Skip("no cgroup v2 (0::) line in /proc/self/cgroup")
	return ""
}

// processCPU is this process's user+system CPU time.
func processCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// burn spins until this process has used d more CPU time (or 10 s pass).
func burn(t *testing.T, d time.Duration) time.Duration {
	t.Helper()
	start, deadline := processCPU(t), time.Now().Add(10*time.Second)
	x := 0
	for processCPU(t)-start < d && time.Now().Before(deadline) {
		for i := range 100000 {
			x += i
		}
	}
	_ = x
	return processCPU(t) - start
}

func TestCgroupV2Mount(t *testing.T) {
	mnt, err := CgroupV2Mount()
	if err != nil {
		t.Skipf("no cgroup v2 hierarchy here: %v", err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "cgroup.controllers")); err != nil {
		t.Errorf("CgroupV2Mount() = %s, not a cgroup v2 root: %v", mnt, err)
	}
	t.Logf("cgroup v2 at %s", mnt)
}

func TestCgroupCPUGrows(t *testing.T) {
	dir := ownCgroupDir(t)
	usage0, user0, sys0, err := CgroupCPU(dir)
	if err != nil {
		t.Fatal(err)
	}
	used := burn(t, 200*time.Millisecond)
	usage1, user1, sys1, err := CgroupCPU(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: usage %.3f -> %.3f s (user %.3f -> %.3f, system %.3f -> %.3f); this process burnt %v",
		dir, usage0, usage1, user0, user1, sys0, sys1, used)
	// The cgroup holds this process, so it saw at least our busy loop
	// (half of it, for accounting granularity).
	if grew := usage1 - usage0; grew < used.Seconds()/2 {
		t.Errorf("usage grew %.3f s, want >= %.3f s", grew, used.Seconds()/2)
	}
	if user1 < user0 || sys1 < sys0 {
		t.Errorf("user or system went down")
	}
	if usage1 <= 0 || user1+sys1 <= 0 {
		t.Errorf("usage %.3f, user+system %.3f: want > 0", usage1, user1+sys1)
	}
}

func TestCgroupMemory(t *testing.T) {
	dir := ownCgroupDir(t)
	if _, err := os.Stat(filepath.Join(dir, "memory.current")); err != nil {
		t.Skipf("no memory.current in %s (root cgroup, or the memory controller is not on the v2 hierarchy, as on a hybrid host): %v", dir, err)
	}
	n, err := CgroupMemory(dir)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Errorf("memory.current of %s = 0 with this process in it", dir)
	}
	t.Logf("%s: memory.current %d bytes", dir, n)
}

// TestCgroupFiles checks parsing and error wrapping on files shaped like
// the kernel's, where the host offers no cgroup to read them from.
func TestCgroupFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := CgroupMemory(dir); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "memory.current")) {
		t.Errorf("missing memory.current: err = %v, want one naming the path", err)
	}
	if _, _, _, err := CgroupCPU(dir); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "cpu.stat")) {
		t.Errorf("missing cpu.stat: err = %v, want one naming the path", err)
	}

	write("memory.current", "123456789\n")
	if n, err := CgroupMemory(dir); err != nil || n != 123456789 {
		t.Errorf("CgroupMemory = %d, %v; want 123456789", n, err)
	}
	write("memory.current", "max\n")
	if _, err := CgroupMemory(dir); err == nil {
		t.Error("memory.current \"max\": no error")
	}

	write("cpu.stat", "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\nnr_periods 0\n")
	usage, user, system, err := CgroupCPU(dir)
	if err != nil || usage != 2.5 || user != 2 || system != 0.5 {
		t.Errorf("CgroupCPU = %v, %v, %v, %v; want 2.5, 2, 0.5", usage, user, system, err)
	}
	write("cpu.stat", "usage_usec 2500000\n")
	if _, _, _, err := CgroupCPU(dir); err == nil {
		t.Error("cpu.stat without user_usec: no error")
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		"/sys/fs/cgroup":     "/sys/fs/cgroup",
		`/mnt/a\040b`:        "/mnt/a b",
		`/mnt/back\134slash`: `/mnt/back\slash`,
		`/mnt/trail\04`:      `/mnt/trail\04`,
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}
