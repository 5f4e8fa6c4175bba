package units

import "testing"

func TestCPUMask(t *testing.T) {
	for _, c := range []struct {
		cpus []int
		want []byte
	}{{[]int{0}, []byte{1}}, {[]int{0, 1}, []byte{3}}, {[]int{9}, []byte{0, 2}}, {[]int{1, 8, 15}, []byte{2, 0x81}}} {
		if got := cpuMask(c.cpus); string(got) != string(c.want) {
			t.Errorf("cpuMask(%v) = %v, want %v", c.cpus, got, c.want)
		}
	}
}

// A VM with host devices gets the locked-memory limit VFIO's pinning needs.
func TestMemLockProperties(t *testing.T) {
	props, err := Unit{Name: "v.service", Argv: []string{"/bin/true"}, MemLock: 1 << 30}.properties()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]any{}
	for _, p := range props {
		got[p.Name] = p.Value.Value()
	}
	if got["LimitMEMLOCK"] != uint64(1<<30) || got["LimitMEMLOCKSoft"] != uint64(1<<30) {
		t.Errorf("LimitMEMLOCK %v, soft %v", got["LimitMEMLOCK"], got["LimitMEMLOCKSoft"])
	}
	props, _ = Unit{Name: "v.service", Argv: []string{"/bin/true"}}.properties()
	for _, p := range props {
		if p.Name == "LimitMEMLOCK" {
			t.Error("LimitMEMLOCK set without MemLock")
		}
	}
}

// TestWorkingDirProperty: an optional working directory has systemd's "-"
// prefix (a missing one leaves the process in "/").
func TestWorkingDirProperty(t *testing.T) {
	for _, c := range []struct {
		u    Unit
		want any
	}{
		{Unit{WorkingDir: "/var/lib/vmsup/vms/web"}, "/var/lib/vmsup/vms/web"},
		{Unit{WorkingDir: "/var/lib/vmsup/vms/web", WorkingDirOptional: true}, "-/var/lib/vmsup/vms/web"},
		{Unit{}, nil},
	} {
		c.u.Name, c.u.Argv = "v.service", []string{"/bin/true"}
		props, err := c.u.properties()
		if err != nil {
			t.Fatal(err)
		}
		var got any
		for _, p := range props {
			if p.Name == "WorkingDirectory" {
				got = p.Value.Value()
			}
		}
		if got != c.want {
			t.Errorf("%+v: WorkingDirectory %v, want %v", c.u, got, c.want)
		}
	}
}
