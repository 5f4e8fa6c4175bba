package spec

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// writeFiles writes name -> body under a new directory.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The merge rules: tables deep-merged, [[disk]] and [[nic]] by name (a NIC
// overridden key by key, a disk added), other values replaced, the VM file
// last; a profile's relative paths against its directory; origins.
func TestIncludeMergeRules(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"profiles/base.toml": `memory = "512M"
cpus = 2
[boot]
kernel = "vmlinuz"
cmdline = "console=ttyS0"
[limits]
tasks_max = 64
[[nic]]
name = "lan"
mac = "52:54:00:00:00:01"
forwards = ["tcp:127.0.0.1:2222-:22"]
[[disk]]
name = "root"
file = "/images/root.qcow2"
size = "1G"
`,
		"profiles/big.toml": `include = ["base.toml"]
memory = "2G"
`,
		"web.toml": `name = "web"
include = ["profiles/big.toml"]
cpus = 4
[boot]
cmdline = "console=ttyS0 quiet"
[[nic]]
name = "lan"
mac = "52:54:00:00:00:02"
[[disk]]
name = "data"
file = "/images/data.qcow2"
size = "2G"
`,
	})
	f, err := Load(filepath.Join(dir, "web.toml"))
	if err != nil {
		t.Fatal(err)
	}
	vm := f.VM
	got := map[string]any{
		"memory": vm.Memory.String(), "cpus": vm.CPUs,
		"kernel": vm.Boot.Kernel, "cmdline": vm.Boot.Cmdline,
		"nics": len(vm.NICs), "nic.model": vm.NICs[0].MAC, "nic.forwards": strings.Join(vm.NICs[0].Forwards, ","),
		"disks": []string{vm.Disks[0].Name, vm.Disks[1].Name}, "data.size": vm.Disks[1].Size.String(),
	}
	want := map[string]any{
		"memory": "2G", "cpus": 4, // big over base; the VM file over both
		"kernel": filepath.Join(dir, "profiles", "vmlinuz"), "cmdline": "console=ttyS0 quiet",
		"nics": 1, "nic.model": "52:54:00:00:00:02", "nic.forwards": "tcp:127.0.0.1:2222-:22", // merged by name
		"disks": []string{"root", "data"}, "data.size": "2G", // added
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("merged VM (-want +got):\n%s", d)
	}
	if strings.Contains(string(f.Raw), "include") {
		t.Errorf("the recorded TOML keeps include:\n%s", f.Raw)
	}
	if _, err := Parse(f.Path, f.Raw); err != nil {
		t.Errorf("the merged TOML does not stand alone: %v", err)
	}
	o := f.Origins()
	for key, file := range map[string]string{
		"memory": "profiles/big.toml", "cpus": "web.toml", "boot.kernel": "profiles/base.toml",
		"nic[0].mac": "web.toml", "nic[0].forwards": "profiles/base.toml", "disk[1].size": "web.toml",
	} {
		if got := o[key].File; got != filepath.Join(dir, file) {
			t.Errorf("origin of %s = %q, want %s", key, got, file)
		}
	}
	lines := strings.Join(f.OriginLines(), "\n")
	if !strings.Contains(lines, `memory = '2G'  # `+filepath.Join(dir, "profiles/big.toml")+":2:1") {
		t.Errorf("origin lines:\n%s", lines)
	}
}

// An error in a profile's value names the profile and its line.
func TestIncludeErrorNamesProfile(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"base.toml": "memory = \"512M\"\ncpus = -1\n",
		"vm.toml":   "name = \"x\"\ninclude = [\"base.toml\"]\n",
		"loop.toml": "name = \"y\"\ninclude = [\"loop.toml\"]\nmemory = \"1G\"\n",
	})
	_, err := Load(filepath.Join(dir, "vm.toml"))
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "base.toml")+":2:1: cpus") {
		t.Errorf("error = %v, want it at base.toml:2:1 cpus", err)
	}
	_, err = Load(filepath.Join(dir, "loop.toml"))
	if err == nil || !strings.Contains(err.Error(), "includes itself") {
		t.Errorf("error = %v, want a loop refused", err)
	}
}
