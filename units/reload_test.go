package units_test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/units"
)

// TestReloadKeepsProperties: transient units with every Unit and Sandbox
// field vmsup sets (a VM's shape, a dynamic user's, a root reader's with
// capabilities) keep each of their properties across a daemon-reload,
// which makes systemd 252 re-read a unit from the file it wrote at start
// (/run/systemd/transient/UNIT): a property written in a form the parser
// does not read back is lost (ExecStopEx= and ExecStopPostEx=, "Unknown
// key ... ignoring", and with them the stop hooks; RestrictNamespaces=yes,
// written as "RestrictNamespaces=" and read back as "no"). Then the stop
// hooks run after the reload, as root.
func TestReloadKeepsProperties(t *testing.T) {
	m, ctx := connect(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	hidden := t.TempDir()
	vm := units.Unit{
		Name: "vmsup-reload.service", Description: "reload test", Slice: "vmsup.slice",
		Argv:                []string{"/bin/sleep", "300"},
		ExecStop:            [][]string{units.WhileMainRuns([]string{"/bin/sh", "-c", "id -u > " + dir + "/stop"})},
		ExecStopPost:        [][]string{{"/bin/sh", "-c", "id -u > " + dir + "/post"}},
		StopHooksPrivileged: true,
		TimeoutStop:         7 * time.Second, After: []string{"network.target"}, Before: []string{"vmsup-other.service"},
		Environment: []string{"A=b c", "D=e"}, WorkingDir: dir, WorkingDirOptional: true, UMask: 0o077,
		MemoryMax: 64 << 20, CPUAccounting: true, CPUQuota: 50, CPUWeight: 200, CPUAffinity: []int{0},
		TasksMax: 32, MemLock: 1 << 20, NetworkNamespacePath: "/proc/1/ns/net",
		DeviceAllow: []units.DeviceRule{{Path: "/dev/null", Access: "rw"}},
		Sandbox: &units.Sandbox{User: "daemon", Group: "daemon", SupplementaryGroups: []string{"users"},
			ReadWritePaths: []string{dir, "-" + dir + "/gone"}, BindPaths: []string{dir, "-" + hidden + "/gone"}, HidePaths: []string{hidden},
			ReadOnlyBindPaths: []string{"/bin/sleep"}, HostNetwork: true, AllowWriteExecute: true,
			Devices: []units.DeviceRule{{Path: "/dev/zero", Access: "rw"}}},
	}
	dynamic := units.Unit{Name: "vmsup-reload-dynamic.service", Argv: []string{"/bin/sleep", "300"}, Collect: true,
		Sandbox: &units.Sandbox{User: "vmsup-reload", DynamicUser: true, ReadOnlyBindPaths: []string{"/bin/sleep"}}}
	reader := units.Unit{Name: "vmsup-reload-reader.service", Argv: []string{"/bin/sleep", "300"},
		Sandbox: &units.Sandbox{Capabilities: []string{"CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_SYS_ADMIN"},
			Netlink: true, SeeProcesses: true, ReadOnlyBindPaths: []string{dir}}}
	all := []units.Unit{vm, dynamic, reader}
	before := map[string]map[string]string{}
	for _, u := range all {
		if err := m.Start(ctx, u); err != nil {
			t.Fatalf("%s: %v", u.Name, err)
		}
		t.Cleanup(func() { _ = m.Stop(context.WithoutCancel(ctx), u.Name) })
		waitState(t, m, ctx, u.Name, "active")
		p, err := sandbox.UnitProperties(ctx, u.Name)
		if err != nil {
			t.Fatal(err)
		}
		before[u.Name] = p
	}
	if out, err := sandbox.Systemctl(ctx, "daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v %s", err, out)
	}
	for _, u := range all {
		after, err := sandbox.UnitProperties(ctx, u.Name)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(before[u.Name], after); d != "" {
			var lost []string
			for k, v := range before[u.Name] {
				if after[k] != v {
					lost = append(lost, k)
				}
			}
			sort.Strings(lost)
			file, _ := os.ReadFile(filepath.Join(sandbox.RunDir, "systemd", "transient", u.Name))
			t.Errorf("%s: daemon-reload changed %s (-before +after):\n%s\ntransient file:\n%s", u.Name, strings.Join(lost, " "), d, file)
		}
		if j, _ := sandbox.Journal(ctx, u.Name); strings.Contains(j, "Unknown key") {
			t.Errorf("%s: systemd did not understand its own transient file:\n%s", u.Name, j)
		}
	}
	if err := m.Stop(ctx, vm.Name); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"stop", "post"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || strings.TrimSpace(string(b)) != "0" {
			t.Errorf("after the reload, Exec%s ran as uid %q (%v), want 0 (privileged)", f, b, err)
		}
	}
}
