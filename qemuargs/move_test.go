package qemuargs

import (
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// TestMoveTarget: a move target's nodes are Disk's, renamed so they do
// not clash with the source's, stable for one target, distinct for two;
// an RBD target's secret object is renamed with its reference.
func TestMoveTarget(t *testing.T) {
	file := spec.Disk{Name: "data", Type: spec.DiskFile, File: "/img/new.qcow2", Format: spec.FormatQcow2, Cache: "none", AIO: "native", Discard: true}
	p, err := MoveTarget(file, DiskHost{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Devices) != 0 || len(p.Objects) != 0 || len(p.Blockdevs) != 2 {
		t.Fatalf("parts: %+v", p)
	}
	proto, format := p.Blockdevs[0], p.Blockdevs[1]
	if proto.NodeName != MoveFileNodeName("data", file) || format.NodeName != MoveNodeName("data", file) || format.File != proto.NodeName {
		t.Errorf("names: %+v %+v", proto, format)
	}
	if proto.NodeName == DiskFileNodeName("data") || format.NodeName == DiskNodeName("data") {
		t.Errorf("a target takes the source's names: %s %s", proto.NodeName, format.NodeName)
	}
	if proto.Filename != file.File || proto.AIO != "native" || !proto.Cache.Direct || proto.Discard != "unmap" || format.Driver != "qcow2" {
		t.Errorf("settings not carried: %+v %+v", proto, format)
	}
	other := file
	other.File = "/img/other.qcow2"
	if MoveNodeName("data", other) == format.NodeName || len(format.NodeName) > maxNodeName {
		t.Errorf("node name %q: not distinct or too long", format.NodeName)
	}

	rbd := spec.Disk{Name: "data", Type: spec.DiskRBD, Pool: "p", Image: "i", User: "u", SecretFile: "/etc/key", Format: spec.FormatRaw, Cache: "writeback", AIO: "threads"}
	p, err = MoveTarget(rbd, DiskHost{SecretFile: "/run/sec"})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Objects) != 1 || p.Objects[0].ID != MoveSecretID("data", rbd) || p.Blockdevs[0].KeySecret != p.Objects[0].ID {
		t.Errorf("rbd target: %+v", p)
	}
	if p.Blockdevs[0].Driver != "rbd" || p.Blockdevs[0].Pool != "p" {
		t.Errorf("rbd protocol node: %+v", p.Blockdevs[0])
	}

	ro := file
	ro.ReadOnly = true
	if _, err := MoveTarget(ro, DiskHost{}); err == nil {
		t.Error("a read-only target was accepted")
	}
}
