package caps

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUserfaultfdFact: what the fact says follows the QEMU version (8.1
// and newer use /dev/userfaultfd) and the device's mode, not a fixed 7.2.
func TestUserfaultfdFact(t *testing.T) {
	cases := []struct {
		name, sysctl, version string
		dev                   os.FileMode // 0: no /dev/userfaultfd
		ok                    bool
		want                  string
	}{
		{"sysctl on", "1", "7.2.22", 0, true, "vm.unprivileged_userfaultfd = 1"},
		{"7.2", "0", "7.2.22", 0o600, false, "QEMU 7.2.22 does not use /dev/userfaultfd"},
		{"10 device closed", "0", "10.0.2", 0o600, false, "QEMU 10.0.2 would use /dev/userfaultfd, but it is mode 0600"},
		{"10 device open", "0", "10.0.2", 0o666, true, "QEMU 10.0.2 opens /dev/userfaultfd (mode 0666)"},
		{"10 no device", "0", "10.0.2", 0, false, "which this host lacks"},
		{"8.1", "0", "8.1.0", 0o666, true, "QEMU 8.1.0 opens"},
		{"8.0", "0", "8.0.5", 0o666, false, "QEMU 8.0.5 does not use"},
	}
	for _, c := range cases {
		root := t.TempDir()
		for _, d := range []string{"proc/sys/vm", "dev"} {
			if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(root, "proc/sys/vm/unprivileged_userfaultfd"), []byte(c.sysctl+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if c.dev != 0 {
			p := filepath.Join(root, "dev/userfaultfd")
			if err := os.WriteFile(p, nil, c.dev); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, c.dev); err != nil { // past the umask
				t.Fatal(err)
			}
		}
		f := userfaultfdFact(fsys(root), c.version)
		text := f.Detail + f.Reason
		if f.OK != c.ok || !strings.Contains(text, c.want) {
			t.Errorf("%s: ok %v %q, want ok %v with %q", c.name, f.OK, text, c.ok, c.want)
		}
	}
}
