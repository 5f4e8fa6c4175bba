package remotetest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// dataDisk is a [[disk]] of 16 MiB in the host's image directory, for a
// VM to back up.
func (h *host) dataDisk(t *testing.T, vm string) string {
	images := filepath.Join(h.root, "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("\n[[disk]]\nname = \"data\"\nfile = %q\nsize = \"16M\"\n", filepath.Join(images, vm+"-data.qcow2"))
}

// sizes are byte counts that differ between two VMs' runs (memory sent).
var sizes = regexp.MustCompile(`[0-9]+(\.[0-9]+)? (B|KiB|MiB|GiB)\b`)

// lastLine is r with only its last stdout line (a migration's result;
// its progress lines come as often as the copy takes) and sizes masked.
func lastLine(r result) result {
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	r.stdout = sizes.ReplaceAllString(lines[len(lines)-1], "<size>") + "\n"
	return r
}

// backupAndMigrate: backup (to a directory the server allows: a relative
// one below ROOT/backups) and migrate --local over --remote print what
// they print on the host; a backup out of the server's backup_dirs and
// migrate --to as an operator are refused.
func (h *host) backupAndMigrate(t *testing.T) {
	t.Helper()
	same(t, "backup", h.remote(t, "admin", "backup", "ra", "--to", "ra-full"),
		h.local(t, "backup", "la", "--to", filepath.Join(h.root, "backups", "la-full")), "ra", "la")
	if _, err := os.Stat(filepath.Join(h.root, "backups", "ra-full", "manifest.json")); err != nil {
		t.Errorf("the remote backup's manifest: %v", err)
	}
	r := h.remote(t, "admin", "backup", "ra", "--to", "/tmp")
	if r.code != 2 || !strings.Contains(r.stderr, "backup --to /tmp: outside this server's backup directories") {
		t.Errorf("remote backup to /tmp: %+v", r)
	}
	r = h.remote(t, "operator", "migrate", "ra", "--to", "elsewhere")
	if r.code != 1 || !strings.Contains(r.stderr, "cn:operator may not migrate: it needs role admin") {
		t.Errorf("remote migrate --to as operator: %+v", r)
	}
	rm := lastLine(h.remote(t, "operator", "migrate", "ra", "--local"))
	same(t, "migrate --local", rm, lastLine(h.local(t, "migrate", "la", "--local")), "ra", "la")
	t.Logf("migrate --local over --remote: %s", strings.TrimSpace(rm.stdout))
	same(t, "status after migrate --local", h.remote(t, "admin", "status", "ra"), h.local(t, "status", "ra"), "", "")
}
