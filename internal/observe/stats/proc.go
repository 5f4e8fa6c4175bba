package stats

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat times:
// sysconf(_SC_CLK_TCK) is fixed at 100 in the Linux/amd64 ABI whatever the
// kernel's HZ, so it needs no cgo to ask.
const clockTicks = 100

// SchedDelay sums, in seconds, the time QEMU's vCPU threads (named "CPU
// N/KVM" or "CPU N/TCG" under -name debug-threads=on) have spent runnable
// but waiting on a runqueue: the 2nd field of /proc/PID/task/TID/schedstat,
// in nanoseconds; guest steal seen from the host. Only vCPU threads: they
// live as long as the VM, so the sum never dips as QEMU's short-lived
// worker threads go. A process with no such thread has all its threads
// counted.
func SchedDelay(pid int) (float64, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("sched delay: %w", err)
	}
	vcpu := func(task string) bool {
		comm, _ := os.ReadFile(filepath.Join(dir, task, "comm"))
		return bytes.HasPrefix(comm, []byte("CPU "))
	}
	anyVCPU := false
	for _, task := range tasks {
		if vcpu(task.Name()) {
			anyVCPU = true
			break
		}
	}
	var ns uint64
	counted := 0
	for _, task := range tasks {
		if anyVCPU && !vcpu(task.Name()) {
			continue
		}
		path := filepath.Join(dir, task.Name(), "schedstat")
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue // the thread exited since the directory was read
		}
		if err != nil {
			return 0, fmt.Errorf("sched delay: %w", err)
		}
		f := strings.Fields(string(data))
		if len(f) < 2 {
			return 0, fmt.Errorf("sched delay: %s: %d fields, want 3", path, len(f))
		}
		wait, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("sched delay: %s: %w", path, err)
		}
		ns += wait
		counted++
	}
	if counted == 0 {
		return 0, fmt.Errorf("sched delay: no thread of %d left in %s", pid, dir)
	}
	return float64(ns) / 1e9, nil
}

// ProcStartTime is when process pid started: field 22 of /proc/PID/stat
// (clock ticks since boot) added to the boot time from /proc/stat. Both
// are whole units (btime in seconds, ticks of 10 ms), so the result is
// never later than the real start but may be up to a second earlier.
func ProcStartTime(pid int) (time.Time, error) {
	path := fmt.Sprintf("/proc/%d/stat", pid)
	data, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, fmt.Errorf("process start time: %w", err)
	}
	// The command name (field 2) may hold spaces and ')': count from the
	// last ')'. What follows starts at field 3, so field 22 is index 19.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return time.Time{}, fmt.Errorf("process start time: %s: no command name", path)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return time.Time{}, fmt.Errorf("process start time: %s: %d fields after the name, want 20 or more", path, len(f))
	}
	ticks, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("process start time: %s: field 22: %w", path, err)
	}
	boot, err := bootTime()
	if err != nil {
		return time.Time{}, fmt.Errorf("process start time: %w", err)
	}
	return boot.Add(time.Duration(ticks) * (time.Second / clockTicks)), nil
}

// bootTime reads the btime line of /proc/stat (unix seconds).
func bootTime() (time.Time, error) {
	const path = "/proc/stat"
	data, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20) // the intr line can be long on big hosts
	for sc.Scan() {
		val, ok := strings.CutPrefix(sc.Text(), "btime ")
		if !ok {
			continue
		}
		sec, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("%s: btime: %w", path, err)
		}
		return time.Unix(sec, 0), nil
	}
	if err := sc.Err(); err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", path, err)
	}
	return time.Time{}, fmt.Errorf("%s: no btime line", path)
}
