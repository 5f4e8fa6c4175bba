package qemuargs

import (
	"encoding/json"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// TestOverlay: the overlay's format node says "backing": null (what
// blockdev-snapshot needs), its names fit QEMU's 31 bytes and follow the path.
func TestOverlay(t *testing.T) {
	d := spec.Disk{Name: "root", Cache: "none", AIO: "threads", Discard: true}
	proto, format := Overlay(d, "/img/root@a.qcow2")
	b, err := json.Marshal(format)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"driver":"qcow2","node-name":"` + OverlayNodeName("/img/root@a.qcow2") + `","file":"` + proto.NodeName +
		`","cache":{"direct":true,"no-flush":false},"discard":"unmap","read-only":false,"backing":null}`
	if string(b) != want {
		t.Fatalf("format node\n got %s\nwant %s", b, want)
	}
	if len(format.NodeName) > maxNodeName || len(proto.NodeName) > maxNodeName || proto.Filename != "/img/root@a.qcow2" {
		t.Fatalf("names %q %q", proto.NodeName, format.NodeName)
	}
	if OverlayNodeName("/img/a") == OverlayNodeName("/img/b") {
		t.Fatal("two paths, one node name")
	}
}
