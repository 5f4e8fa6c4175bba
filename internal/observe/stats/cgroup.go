package stats

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CgroupCPU reads the CPU time, in seconds, that the cgroup at dir (an
// absolute cgroup v2 directory: the v2 mount point plus the unit's
// ControlGroup property) has used, from dir/cpu.stat. cgroup v2 keeps these
// three keys even where the cpu controller is not enabled.
func CgroupCPU(dir string) (usage, user, system float64, err error) {
	path := filepath.Join(dir, "cpu.stat")
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("cgroup cpu: %w", err)
	}
	want := map[string]*float64{"usage_usec": &usage, "user_usec": &user, "system_usec": &system}
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), " ")
		dst := want[key]
		if !ok || dst == nil {
			continue
		}
		usec, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("cgroup cpu: %s: %s: %w", path, key, err)
		}
		*dst = float64(usec) / 1e6
		seen++
	}
	if seen != len(want) {
		return 0, 0, 0, fmt.Errorf("cgroup cpu: %s lacks usage_usec, user_usec or system_usec", path)
	}
	return usage, user, system, nil
}

// CgroupMemory reads dir/memory.current, in bytes. It is absent from the
// root cgroup and wherever the memory controller is not enabled for dir
// (systemd enables it for its units on a pure cgroup v2 host).
func CgroupMemory(dir string) (uint64, error) {
	path := filepath.Join(dir, "memory.current")
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("cgroup memory: %w", err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroup memory: %s: %w", path, err)
	}
	return n, nil
}

// CgroupV2Mount finds where the cgroup v2 hierarchy is mounted, from
// /proc/self/mountinfo: /sys/fs/cgroup on a unified host, but
// /sys/fs/cgroup/unified on a hybrid one (where the v2 tree carries cpu.stat
// but the memory controller stays on v1), so callers should not assume.
func CgroupV2Mount() (string, error) {
	const path = "/proc/self/mountinfo"
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("cgroup v2 mount: %w", err)
	}
	found := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 5 || !strings.HasPrefix(post, "cgroup2 ") || f[3] != "/" {
			continue
		}
		mnt := unescapeMountinfo(f[4])
		if mnt == "/sys/fs/cgroup" {
			return mnt, nil
		}
		if found == "" {
			found = mnt
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("cgroup v2 mount: %s: %w", path, err)
	}
	if found == "" {
		return "", fmt.Errorf("cgroup v2 mount: none in %s", path)
	}
	return found, nil
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space)
// in a mountinfo path.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
