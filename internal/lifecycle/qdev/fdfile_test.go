package qdev

import "testing"

func TestChainOpaque(t *testing.T) {
	for _, c := range []struct {
		disk string
		i    int
		path string
	}{{"root", 0, "/img/a b.qcow2"}, {"root", 2, "/img/base file x.raw"}} {
		o := FDChainOpaque(c.disk, c.i, c.path)
		if got, ok := FDSetFile(o); !ok || got != c.path {
			t.Errorf("FDSetFile(%q) = %q %v, want %q", o, got, ok, c.path)
		}
	}
	if _, ok := FDSetFile(FDOpaque("blk")); ok {
		t.Errorf("a block device's note names no file")
	}
	for in, want := range map[string]string{"fmt-root": "file-root", "b01-root": "b01froot", "b12-x-y": "b12fx-y", "ovl-a": "ovf-a", "other": ""} {
		if got := chainProtocolNode(in); got != want {
			t.Errorf("chainProtocolNode(%q) = %q, want %q", in, got, want)
		}
	}
}
