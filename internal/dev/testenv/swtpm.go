package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// StartSwtpm runs a real swtpm listening on dir/ctrl.sock, as vmsup's
// companion unit does (relative paths: swtpm's options split at commas),
// until the test ends, and returns the socket; it skips the test when
// swtpm is not installed.
func StartSwtpm(t testing.TB, dir string) string {
	t.Helper()
	bin, err := exec.LookPath("swtpm")
	if err != nil {
		t.Skip("a [tpm] needs swtpm (apt-get install swtpm swtpm-tools)")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "ctrl.sock")
	cmd := exec.Command(bin, "socket", "--tpm2", "--tpmstate", "dir=.", "--ctrl", "type=unixio,path=ctrl.sock", "--terminate")
	cmd.Dir, cmd.Stderr = dir, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for i := 0; i < 250; i++ {
		if _, err := os.Stat(sock); err == nil {
			return sock
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("swtpm did not listen on %s", sock)
	return ""
}
