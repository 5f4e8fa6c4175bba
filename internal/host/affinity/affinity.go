// Package affinity pins a running QEMU's vCPU threads to host CPUs: the
// thread of each vCPU comes from QMP's query-cpus-fast, its affinity is set
// with sched_setaffinity. QEMU itself cannot (its seccomp filter denies
// it, and its user could not pin another's threads); vmsup runs as root.
package affinity

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/qmp"
)

// PinVCPUs pins vCPU i's thread to host CPU cpus[i], for every vCPU QEMU
// runs now; setting what a thread already has is harmless, so it is
// re-run after a vCPU hotplug. pid is QEMU's process as this process sees
// it: QEMU reports thread ids of its own PID namespace, which differ from
// ours when systemd runs in another (the test harness's). It returns how
// many threads it pinned.
func PinVCPUs(ctx context.Context, c *qmp.Conn, pid int, cpus []int) (int, error) {
	if len(cpus) == 0 {
		return 0, nil
	}
	vcpus, err := c.QueryCPUsFast(ctx)
	if err != nil {
		return 0, fmt.Errorf("query-cpus-fast: %w", err)
	}
	tids, err := OurTIDs(pid)
	if err != nil {
		return 0, err
	}
	// A thread may run several vCPUs (single-threaded TCG runs them all
	// in one): it gets the CPUs of all of them, not the last one's.
	sets := map[int]*unix.CPUSet{}
	var order []int
	for _, v := range vcpus {
		if v.CPUIndex < 0 || int(v.CPUIndex) >= len(cpus) {
			return 0, fmt.Errorf("vCPU %d has no host CPU in pinning.vcpus (%d given)", v.CPUIndex, len(cpus))
		}
		tid, ok := tids[int(v.ThreadID)]
		if !ok {
			return 0, fmt.Errorf("vCPU %d: thread %d is not a thread of QEMU (pid %d)", v.CPUIndex, v.ThreadID, pid)
		}
		if sets[tid] == nil {
			sets[tid] = &unix.CPUSet{}
			order = append(order, tid)
		}
		sets[tid].Set(cpus[v.CPUIndex])
	}
	for n, tid := range order {
		if err := unix.SchedSetaffinity(tid, sets[tid]); err != nil {
			return n, fmt.Errorf("vCPU thread %d: sched_setaffinity: %w", tid, err)
		}
	}
	return len(order), nil
}

// OurTIDs maps the thread ids QEMU (pid, in our namespace) knows its
// threads by, the innermost of each task's NSpid, to ours.
func OurTIDs(pid int) (map[int]int, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("QEMU's threads: %w", err)
	}
	out := map[int]int{}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "status"))
		if err != nil {
			continue // the thread ended
		}
		out[tid] = tid
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(strings.TrimPrefix(line, "NSpid:")); strings.HasPrefix(line, "NSpid:") && len(f) > 0 {
				if inner, err := strconv.Atoi(f[len(f)-1]); err == nil {
					out[inner] = tid
				}
			}
		}
	}
	return out, nil
}

// FloatVCPUs lets every vCPU thread run on any CPU of set (pinning
// removed: the unit's CPUs, or all the host's).
func FloatVCPUs(ctx context.Context, c *qmp.Conn, pid int, set []int) error {
	vcpus, err := c.QueryCPUsFast(ctx)
	if err != nil {
		return fmt.Errorf("query-cpus-fast: %w", err)
	}
	tids, err := OurTIDs(pid)
	if err != nil {
		return err
	}
	var mask unix.CPUSet
	for _, cpu := range set {
		mask.Set(cpu)
	}
	for _, v := range vcpus {
		if err := unix.SchedSetaffinity(tids[int(v.ThreadID)], &mask); err != nil {
			return fmt.Errorf("vCPU %d: sched_setaffinity to CPUs %v: %w", v.CPUIndex, set, err)
		}
	}
	return nil
}

// Of returns the host CPUs thread tid may run on.
func Of(tid int) ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(tid, &set); err != nil {
		return nil, err
	}
	var out []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out, nil
}
