package units

import (
	"context"
	"os/exec"
	"strings"
	"time"
)

// LastWords returns the last error line QEMU wrote to the unit's journal
// (journalDir: a journal that is not the host's, read with journalctl -D),
// or where to look.
func LastWords(ctx context.Context, journalDir, unit string) string {
	args := []string{"-u", unit, "-o", "cat", "--no-pager", "-n", "20"}
	if journalDir != "" {
		args = append([]string{"-D", journalDir}, args...)
	}
	hint := "see journalctl -u " + unit
	var last string
	// journald may not have the lines yet when the unit has already failed.
	for range 10 {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		out, err := exec.CommandContext(cctx, "journalctl", args...).Output()
		cancel()
		if err != nil {
			return hint
		}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			// QEMU prefixes its errors with its name: "qemu-system-x86_64:"
			// from most of it, "qemu:" from the loaders.
			if strings.Contains(l, "qemu-system") || strings.HasPrefix(l, "qemu:") {
				last = l
			}
		}
		if last != "" {
			return last
		}
		time.Sleep(50 * time.Millisecond)
	}
	return hint
}
