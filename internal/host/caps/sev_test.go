package caps

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/spec"
)

// TestSEV: the probe says why a host cannot run SEV guests (no kvm_amd,
// sev off, no /dev/sev), and validate refuses an SEV guest there with that
// reason, naming the sev key.
func TestSEV(t *testing.T) {
	root := t.TempDir()
	param := filepath.Join(root, "sys/module/kvm_amd/parameters/sev")
	if got := sevFact(fsys(root)); got.OK || !strings.Contains(got.Reason, "kvm_amd module is not loaded") {
		t.Errorf("no kvm_amd: %+v", got)
	}
	if err := os.MkdirAll(filepath.Dir(param), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(param, []byte("N\n"), 0o644)
	if got := sevFact(fsys(root)); got.OK || !strings.Contains(got.Reason, "sev = N") {
		t.Errorf("sev off: %+v", got)
	}
	os.WriteFile(param, []byte("Y\n"), 0o644)
	if got := sevFact(fsys(root)); got.OK || !strings.Contains(got.Reason, "no /dev/sev") {
		t.Errorf("no /dev/sev: %+v", got)
	}
	if os.Geteuid() == 0 {
		os.MkdirAll(filepath.Join(root, "dev"), 0o755)
		if err := unix.Mknod(filepath.Join(root, "dev/sev"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err == nil {
			if got := sevFact(fsys(root)); !got.OK {
				t.Errorf("SEV host: %+v", got)
			}
		}
	}
	f, err := spec.Parse("/x/enc.toml", []byte("name = \"enc\"\nmemory = \"512M\"\nboot.kernel = \"/k\"\n[sev]\npolicy = 3\ncbitpos = 47\nreduced_phys_bits = 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	err = checkSEV(f, func() string { return "kvm_amd runs with sev = N" })
	if err == nil || !strings.Contains(err.Error(), "/x/enc.toml") || !strings.Contains(err.Error(), "sev: this host cannot run SEV guests: kvm_amd runs with sev = N") {
		t.Errorf("checkSEV on a host without SEV: %v", err)
	}
	if err := checkSEV(f, func() string { return "" }); err != nil {
		t.Errorf("checkSEV on an SEV host: %v", err)
	}
}
