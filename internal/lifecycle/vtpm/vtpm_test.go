package vtpm

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vmsup/vmsup/units"
)

// TestUnit: swtpm runs in its own directory with relative paths (its
// options split at commas), as QEMU's user, seeing of the host only that
// directory, without network; a local migration's destination gets a
// directory of its own.
func TestUnit(t *testing.T) {
	p := PathsFor("/var/lib/vmsup/vms/a,b", "")
	if p.Dir != "/var/lib/vmsup/vms/a,b/tpm" || p.Socket != p.Dir+"/ctrl.sock" {
		t.Errorf("paths %+v", p)
	}
	if alt := PathsFor("/var/lib/vmsup/vms/a,b", "migrated"); alt.Dir != "/var/lib/vmsup/vms/a,b/tpm-migrated" {
		t.Errorf("a local migration's destination: %+v", alt)
	}
	u := Unit("vmsup-tpm@web.service", "web", "vmsup-web.service", Binaries{Swtpm: "/usr/bin/swtpm"}, p,
		&units.Sandbox{User: "vmsupq-web", HostNetwork: true, ReadWritePaths: []string{"/srv"}})
	want := []string{"/usr/bin/swtpm", "socket", "--tpm2", "--tpmstate", "dir=.", "--ctrl", "type=unixio,path=ctrl.sock",
		"--terminate", "--log", "level=1"}
	if !slices.Equal(u.Argv, want) || u.WorkingDir != p.Dir {
		t.Errorf("argv %q in %s", u.Argv, u.WorkingDir)
	}
	sb := u.Sandbox
	if sb == nil || sb.User != "vmsupq-web" || sb.HostNetwork || !slices.Equal(sb.ReadWritePaths, []string{p.Dir}) ||
		!slices.Equal(sb.HidePaths, []string{"/var/lib/vmsup/vms"}) {
		t.Errorf("sandbox %+v", sb)
	}
}

// TestPrepare manufactures a TPM once (the real swtpm_setup, where
// installed) and keeps it at the next start.
func TestPrepare(t *testing.T) {
	b, err := Find()
	if err != nil {
		t.Skip(err)
	}
	p := PathsFor(filepath.Join(t.TempDir(), "x,y"), "")
	if err := Prepare(context.Background(), b, p, true, os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(p.Dir, stateFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := Prepare(context.Background(), b, p, true, os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	if st2, err := os.Stat(filepath.Join(p.Dir, stateFile)); err != nil || !st2.ModTime().Equal(st.ModTime()) {
		t.Errorf("the TPM was manufactured again: %v", err)
	}
}
