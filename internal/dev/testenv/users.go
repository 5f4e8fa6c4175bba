package testenv

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// RemoveGoneQEMUUsers deletes the per-VM QEMU users (confine.UserName)
// whose state root was a temporary directory that no longer exists: every
// test's root is a new directory, so each test VM gets a user of its own,
// and system uids are few (100-999). A user's comment names its root
// (confine.UserComment); users without one, of a root that exists, or
// with a process left (userdel refuses) are kept.
func RemoveGoneQEMUUsers() {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return
	}
	var gone []string
	sc := bufio.NewScanner(f)
	tmp := filepath.Clean(os.TempDir()) + "/"
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 5 || !strings.HasPrefix(fields[0], "vmsupq-") {
			continue
		}
		c := strings.Fields(fields[4])
		if len(c) != 3 || c[0] != "vmsup" || !strings.HasPrefix(c[1], tmp) {
			continue
		}
		if _, err := os.Stat(c[1]); os.IsNotExist(err) {
			gone = append(gone, fields[0])
		}
	}
	f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, u := range gone {
		_ = exec.CommandContext(ctx, "userdel", u).Run()
	}
}
