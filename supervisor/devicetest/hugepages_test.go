package devicetest

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestHugepages: a VM with hugepages = "2M" has its memory in a hugetlbfs
// file on the pages the test reserved: QEMU's smaps shows one mapping of
// the guest's size there, with 2 MiB kernel pages.
func TestHugepages(t *testing.T) {
	if huge.skip != "" {
		t.Skip("hugepages: " + huge.skip)
	}
	ctx := supervisortest.Context(t, 3*time.Minute)
	dir := t.TempDir()
	body := fmt.Sprintf(`name = "hugevm"
memory = "128M"
hugepages = "2M"
accel = "tcg"
hotplug_slots = 0
stop_timeout = "20s"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0"
`, env.Guest.Kernel, env.Guest.Initrd)
	sup, _ := upVM(t, ctx, dir, "hugevm", body)
	st := status(t, ctx, sup, "hugevm")
	supervisortest.Shell(t, ctx, st) // booted: the guest touched its memory
	pids, err := env.Systemd.HostPIDs("vmsup-hugevm.service")
	if err != nil || len(pids) == 0 {
		t.Fatalf("QEMU's pid: %v %v", pids, err)
	}
	m, err := hugeMapping(pids[0], huge.dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.sizeKB != 128<<10 || m.pageKB != 2048 {
		t.Errorf("QEMU's mapping in %s: %+v, want 131072 kB on 2048 kB pages", huge.dir, m)
	}
}

var rangeRE = regexp.MustCompile(`^[0-9a-f]+-[0-9a-f]+$`)

type mapping struct {
	path           string
	sizeKB, pageKB int
}

// hugeMapping finds QEMU's mapping of a file in dir in /proc/PID/smaps.
func hugeMapping(pid int, dir string) (mapping, error) {
	fh, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return mapping{}, err
	}
	defer fh.Close()
	var cur *mapping
	var found []mapping
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 5 && rangeRE.MatchString(f[0]): // a mapping's first line; a file's has its path
			if cur != nil {
				found = append(found, *cur)
			}
			cur = nil
			if len(f) >= 6 && strings.HasPrefix(f[5], dir+"/") {
				cur = &mapping{path: strings.Join(f[5:], " ")}
			}
		case cur != nil && len(f) == 3 && f[0] == "Size:":
			fmt.Sscan(f[1], &cur.sizeKB)
		case cur != nil && len(f) == 3 && f[0] == "KernelPageSize:":
			fmt.Sscan(f[1], &cur.pageKB)
		}
	}
	if cur != nil {
		found = append(found, *cur)
	}
	if len(found) != 1 {
		return mapping{}, fmt.Errorf("QEMU (pid %d) has %d mappings in %s, want 1: %+v", pid, len(found), dir, found)
	}
	return found[0], sc.Err()
}
