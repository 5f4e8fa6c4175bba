package supervisor_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// TestValidateHostPaths: the library's Validate refuses a disk or kernel
// outside the places Options gives (/etc/shadow as it is, through a
// symlink in the image directory, by ".." out of it), one line per key
// and nothing else about it; the same files pass once the host allows
// their directory (Options.AllowPaths).
func TestValidateHostPaths(t *testing.T) {
	dir, root := t.TempDir(), t.TempDir()
	images := filepath.Join(root, "images")
	if err := os.MkdirAll(images, 0o711); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(images, "shadow.raw")
	if err := os.Symlink("/etc/shadow", link); err != nil {
		t.Fatal(err)
	}
	kernel, data := filepath.Join(dir, "vmlinux"), filepath.Join(dir, "data.raw")
	for _, p := range []string{kernel, data} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	load := func(name, disk string) *spec.File {
		f, err := spec.Parse(filepath.Join(dir, name+".toml"), fmt.Appendf(nil, `name = %q
memory = "256M"
accel = "tcg"
[boot]
kernel = %q
[[disk]]
name = "data"
file = %q
format = "raw"
`, name, kernel, disk))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	host := &supervisor.Host{KVMUnusable: "test", MemTotal: 8 << 30}
	sup, err := supervisor.New(supervisor.Options{Root: root, Self: "/bin/true", Host: host})
	if err != nil {
		t.Fatal(err)
	}
	defer sup.Close()
	for i, p := range []string{"/etc/shadow", link, images + "/../../../../../../../../etc/shadow"} {
		f := load(fmt.Sprintf("v%d", i), p)
		err := sup.Validate(f)
		lines := strings.Split(fmt.Sprint(err), "\n")
		want := []string{
			fmt.Sprintf("%s:5:1: boot.kernel: %s is outside the places VM files may name (image directories: %s; allowed: /var/cache/vmsup)", f.Path, kernel, images),
			fmt.Sprintf("%s:8:1: disk[0].file: %s", f.Path, p),
		}
		if err == nil || len(lines) != 2 || !strings.HasPrefix(lines[0], want[0]) || !strings.HasPrefix(lines[1], want[1]) ||
			!strings.Contains(lines[1], "is outside the places VM files may name") {
			t.Errorf("Validate (disk %s): %v\nwant two lines starting\n%s\n%s ... is outside the places", p, err, want[0], want[1])
		}
	}
	allowing, err := supervisor.New(supervisor.Options{Root: root, Self: "/bin/true", Host: host, AllowPaths: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	defer allowing.Close()
	if err := allowing.Validate(load("ok", data)); err != nil {
		t.Errorf("Validate with the files' directory allowed: %v", err)
	}
	if err := allowing.Validate(load("still", link)); err == nil || !strings.Contains(err.Error(), "(leads to /etc/shadow) is outside") {
		t.Errorf("Validate of a symlink to /etc/shadow with another directory allowed: %v", err)
	}
}
