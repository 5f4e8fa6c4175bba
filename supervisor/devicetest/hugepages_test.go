package devicetest

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// checkHugepages: the VM (hugepages = "2M", 128M) has its memory in a
// hugetlbfs file on the pages the package reserved: QEMU's smaps shows one
// mapping of the guest's size there, with 2 MiB kernel pages.
func checkHugepages(t *testing.T, unit string) {
	pids, err := env.Systemd.HostPIDs(unit)
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
