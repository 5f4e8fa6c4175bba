package consolelog

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestRSS builds a logger process (testdata/logger: Run, as vmsup's) and
// measures its resident memory, waiting and in a flood: one runs per VM.
func TestRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	fifo, c := setup(t, DefaultMaxBytes, DefaultKeep)
	bin := filepath.Join(t.TempDir(), "logger")
	if out, err := exec.Command(gobin, "build", "-o", bin, "./testdata/logger").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, fifo, c.Path, strconv.FormatInt(c.MaxBytes, 10), strconv.Itoa(c.Keep))
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	w := openWriter(t, fifo) // the logger is waiting
	waiting := procStatus(t, cmd.Process.Pid)

	const total = 256 << 20
	line := bytes.Repeat([]byte("[    1.234567] the guest floods its console .......\r\n"), 1000)
	var peak int64
	for off := 0; off < total; off += len(line) {
		if _, err := w.Write(line); err != nil {
			t.Fatal(err)
		}
		if off%(8<<20) < len(line) {
			peak = max(peak, procStatus(t, cmd.Process.Pid)["VmRSS"])
		}
	}
	flooded := procStatus(t, cmd.Process.Pid)
	w.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("logger: %v\n%s", err, stderr.Bytes())
	}
	readLog(t, c)
	t.Logf("logger: waiting VmRSS %d kB (anon %d kB); in a %d MiB flood VmRSS ≤ %d kB sampled, %d kB at the end (anon %d kB), VmHWM %d kB",
		waiting["VmRSS"], waiting["RssAnon"], total>>20, peak, flooded["VmRSS"], flooded["RssAnon"], flooded["VmHWM"])
	if flooded["VmHWM"] > 16<<10 {
		t.Errorf("logger's peak RSS %d kB, more than 16 MiB", flooded["VmHWM"])
	}
}

// procStatus returns the kB figures of /proc/PID/status.
func procStatus(t *testing.T, pid int) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if v, found := strings.CutSuffix(strings.TrimSpace(v), " kB"); ok && found {
			m[k], _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return m
}
