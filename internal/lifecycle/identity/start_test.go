package identity

import (
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// TestIncoming: a destination keeps the source's UUID and generation id
// (the file's uuid first); a vmgenid VM from a source without one gets one.
func TestIncoming(t *testing.T) {
	src := IDs{UUID: "u-src", GenID: "g-src"}
	if got := Incoming(&spec.VM{}, src); got != src {
		t.Errorf("got %+v, want the source's", got)
	}
	if got := Incoming(&spec.VM{UUID: "u-file"}, src); got.UUID != "u-file" || got.GenID != "g-src" {
		t.Errorf("file uuid: %+v", got)
	}
	if got := Incoming(&spec.VM{}, IDs{UUID: "u-src"}); got.GenID != "" {
		t.Errorf("no vmgenid: %+v", got)
	}
	if got := Incoming(&spec.VM{VMGenID: true}, IDs{UUID: "u-src"}); got.UUID != "u-src" || got.GenID == "" {
		t.Errorf("vmgenid from an older source: %+v", got)
	}
}
