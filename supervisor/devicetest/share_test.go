package devicetest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestShares: over virtio-9p the guest reads a host file and writes one the
// host sees; a read-only share refuses writes; symlinks in a share that
// point outside it lead nowhere on the host (the guest resolves them in its
// own tree), and nothing else of the host is visible. The same guest runs
// on hugepages (one boot for both): see checkHugepages.
func TestShares(t *testing.T) {
	ctx := supervisortest.Context(t, 4*time.Minute)
	dir := t.TempDir()
	data, docs := filepath.Join(dir, "data"), filepath.Join(dir, "docs")
	outside := filepath.Join(dir, "outside.txt")
	for _, d := range []string{data, docs} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		filepath.Join(data, "hello.txt"):  "from-host",
		filepath.Join(docs, "readme.txt"): "docs-only",
		outside:                           "host-secret",
	}
	for p, c := range files {
		if err := os.WriteFile(p, []byte(c+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range map[string]string{"rel": "../outside.txt", "abs": outside} {
		if err := os.Symlink(target, filepath.Join(data, name)); err != nil {
			t.Fatal(err)
		}
	}
	pages := ""
	if huge.skip == "" {
		pages = `hugepages = "2M"`
	}
	body := fmt.Sprintf(`name = "sharevm"
memory = "128M"
%s
accel = "tcg"
hotplug_slots = 0
stop_timeout = "20s"

[[share]]
path = "data"
tag = "data"

[[share]]
path = "docs"
tag = "docs"
read_only = true

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check"
`, pages, env.Guest.Kernel, env.Guest.Initrd)
	sup, _ := upVM(t, ctx, dir, "sharevm", body)
	st := status(t, ctx, sup, "sharevm")
	sh := shell(t, ctx, st)
	run := func(cmd string) string {
		t.Helper()
		out, _, err := sh.Run(ctx, cmd)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(strings.ReplaceAll(out, "\r", ""))
	}
	if out := run("mkdir -p /mnt/data /mnt/docs && mount -t 9p -o trans=virtio,version=9p2000.L data /mnt/data && " +
		"mount -t 9p -o trans=virtio,version=9p2000.L docs /mnt/docs && echo mounted"); !strings.HasSuffix(out, "mounted") {
		t.Fatalf("mount the shares: %s", out)
	}
	if got := run("cat /mnt/data/hello.txt"); got != "from-host" {
		t.Errorf("the guest reads %q from the host's file, want from-host", got)
	}
	run("echo from-guest > /mnt/data/guest.txt; sync")
	if b, err := os.ReadFile(filepath.Join(data, "guest.txt")); err != nil || string(b) != "from-guest\n" {
		t.Errorf("the host reads the guest's file: %q, %v", b, err)
	}
	if got := run("cat /mnt/docs/readme.txt"); got != "docs-only" {
		t.Errorf("the read-only share reads %q, want docs-only", got)
	}
	if got := run("echo x > /mnt/docs/new.txt && echo written || echo refused"); !strings.HasSuffix(got, "refused") {
		t.Errorf("a write into the read-only share: %q", got)
	}
	if _, err := os.Stat(filepath.Join(docs, "new.txt")); err == nil {
		t.Error("the guest created a file in the read-only share")
	}
	for _, link := range []string{"rel", "abs"} {
		if got := run("cat /mnt/data/" + link + " 2>&1; true"); strings.Contains(got, "host-secret") {
			t.Errorf("the guest read a host file outside the share through symlink %s: %q", link, got)
		}
	}
	t.Run("hugepages", func(t *testing.T) {
		if huge.skip != "" {
			t.Skip("hugepages: " + huge.skip)
		}
		checkHugepages(t, "vmsup-sharevm.service")
	})
}
