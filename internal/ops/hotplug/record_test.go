package hotplug

import (
	"testing"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// TestRecord: a device attached by hand is recorded outside the file's
// spec, one of the file (apply) in the record's spec, which then no longer
// has the boot layout (Replugged); either is found and dropped the same way.
func TestRecord(t *testing.T) {
	for _, fromFile := range []bool{false, true} {
		vm := &spec.VM{Name: testVM, CPUs: 1, Memory: 256 * spec.MiB}
		app := &vmstore.Applied{Name: testVM, Spec: vmstore.Canonical(vm),
			Moved: map[string]vmstore.MovedDisk{"d": {From: "/img/old.qcow2"}}}
		d := vmstore.AttachedDisk{Disk: spec.Disk{Name: "d", Type: spec.DiskFile, File: "/img/d.qcow2"}, Bus: "rp1"}
		if err := recordDisk(app, d, fromFile); err != nil {
			t.Fatal(err)
		}
		if err := recordNIC(app, spec.NIC{Name: "n", Type: spec.NICUser}, fromFile); err != nil {
			t.Fatal(err)
		}
		got, err := app.VM()
		if err != nil {
			t.Fatal(err)
		}
		inSpec := findDisk(got, "d") != nil && findNIC(got, "n") != nil
		byHand := len(app.Attached) == 1 && app.Attached[0].Bus == "rp1" && len(app.AttachedNICs) == 1
		if inSpec != fromFile || byHand == fromFile || app.Replugged != fromFile {
			t.Errorf("fromFile %v: in the spec %v, by hand %v, replugged %v", fromFile, inSpec, byHand, app.Replugged)
		}
		if !hasDisk(app, "d") || !hasNIC(app, "n") || hasDisk(app, "n") || hasNIC(app, "d") {
			t.Errorf("fromFile %v: has disk %v, nic %v", fromFile, hasDisk(app, "d"), hasNIC(app, "n"))
		}
		if err := dropDisk(app, "d"); err != nil {
			t.Fatal(err)
		}
		if err := dropNIC(app, "n"); err != nil {
			t.Fatal(err)
		}
		if hasDisk(app, "d") || hasNIC(app, "n") || len(app.Moved) != 0 {
			t.Errorf("fromFile %v: after the drops: disk %v, nic %v, moved %v", fromFile, hasDisk(app, "d"), hasNIC(app, "n"), app.Moved)
		}
	}
	app := &vmstore.Applied{Name: testVM}
	h := &hostDev{in: hostDevIntent{Dev: spec.HostDev{Address: "0000:01:00.0", Name: "gpu"}, Bus: "rp3"}}
	if err := h.Record(app, nil); err != nil || !h.Recorded(app) || app.AttachedHostDevs[0].Bus != "rp3" {
		t.Errorf("host device: %v, %+v", err, app.AttachedHostDevs)
	}
	if err := h.Forget(app); err != nil || h.Recorded(app) {
		t.Errorf("host device forgotten: %v, %+v", err, app.AttachedHostDevs)
	}
}
