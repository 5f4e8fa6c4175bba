package qmp

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// MaxLoadFactor caps how far the host's load stretches a wait.
const MaxLoadFactor = 4.0

// LoadFactor is how much the host's load stretches a wait on QEMU: its
// one-minute load average per online CPU, from 1 (idle, or no more
// runnable tasks than CPUs) up to MaxLoadFactor. Read at most once a
// second: every QMP command asks.
func LoadFactor() float64 {
	now := time.Now().UnixNano()
	if c := lastLoad.Load(); c != nil && now-c.at < int64(time.Second) {
		return c.f
	}
	f := 1.0
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f = loadFactor(string(b), runtime.NumCPU())
	}
	lastLoad.Store(&loadReading{at: now, f: f})
	return f
}

type loadReading struct {
	at int64
	f  float64
}

var lastLoad atomic.Pointer[loadReading]

func loadFactor(loadavg string, cpus int) float64 {
	f := strings.Fields(loadavg)
	if len(f) == 0 || cpus < 1 {
		return 1
	}
	load, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 1
	}
	return min(max(load/float64(cpus), 1), MaxLoadFactor)
}
