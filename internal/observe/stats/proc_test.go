package stats

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestSchedDelayGrowsUnderContention(t *testing.T) {
	before, err := SchedDelay(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// More busy threads than CPUs, so some wait on a runqueue. GOMAXPROCS
	// is raised for the while, or Go would run only NumCPU at a time.
	n := 4 * runtime.NumCPU()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(n))
	var wg sync.WaitGroup
	stop := time.Now().Add(300 * time.Millisecond)
	for range n {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			x := 0
			for time.Now().Before(stop) {
				x++
			}
			_ = x
		})
	}
	wg.Wait()
	after, err := SchedDelay(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("delay %.3f -> %.3f s with %d busy threads on %d CPUs", before, after, n, runtime.NumCPU())
	if after <= before {
		t.Errorf("delay did not grow: %.3f -> %.3f s", before, after)
	}
}

func TestProcStartTime(t *testing.T) {
	start, err := ProcStartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	t.Logf("started %v (%v ago)", start, now.Sub(start))
	if !start.Before(now) {
		t.Errorf("start %v is not before now %v", start, now)
	}
	if now.Sub(start) > 10*time.Minute {
		t.Errorf("start %v is %v ago; the test binary is younger", start, now.Sub(start))
	}
}

// TestProcGone uses the pid of a child already reaped.
func TestProcGone(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Skipf("pid %d already reused", pid)
	}
	if _, err := SchedDelay(pid); err == nil || !strings.Contains(err.Error(), "/proc/"+strconv.Itoa(pid)+"/") {
		t.Errorf("SchedDelay(gone) err = %v, want one naming the path", err)
	}
	if _, err := ProcStartTime(pid); err == nil || !strings.Contains(err.Error(), "/proc/"+strconv.Itoa(pid)+"/") {
		t.Errorf("ProcStartTime(gone) err = %v, want one naming the path", err)
	}
}
