package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Where a scale step's time goes: the CPU the whole host and the sandbox's
// systemd (PID 1 of vmsup's units, single-threaded) spent on it, per VM.

// clkTck is USER_HZ, the unit of /proc's CPU times (100 on Linux).
const clkTck = 100

// cpuSample is CPU time so far, in ms: the host's (all CPUs, idle and
// iowait left out) and one process's.
type cpuSample struct{ host, pid1 float64 }

func sampleCPU(pid int) cpuSample {
	return cpuSample{host: hostBusyMs(), pid1: procCPUMs(pid)}
}

// perVM is the CPU spent from s to now, per VM of n.
func (s cpuSample) perVM(now cpuSample, n int) cpuSample {
	return cpuSample{host: (now.host - s.host) / float64(n), pid1: (now.pid1 - s.pid1) / float64(n)}
}

// hostBusyMs is the host's busy CPU time (/proc/stat's first line, less
// idle and iowait), in ms.
func hostBusyMs() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy float64
	for i, v := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseFloat(v, 64)
		busy += n
	}
	return busy * 1000 / clkTck
}

// procCPUMs is a process's user+system CPU time, in ms (0 if unknown).
func procCPUMs(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which may hold spaces.
	_, rest, ok := strings.Cut(string(b), ") ")
	if !ok {
		return 0
	}
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) * 1000 / clkTck
}
