package remoteapi_test

import (
	"strings"
	"testing"

	"github.com/vmsup/vmsup/remoteapi"
)

// TestUnitsCarryArgs: the service runs the server with the global flags
// it is given (quoted for systemd), before "api serve".
func TestUnitsCarryArgs(t *testing.T) {
	_, svc, err := remoteapi.Units(remoteapi.UnitOptions{Self: "/usr/bin/vmsup", Config: "/x/remote/remote.toml",
		Listen: "127.0.0.1:8443", Args: []string{"--root=/x", "--allow-path=/srv/my vms", "--qemu-user=vmsup-qemu"}})
	if err != nil {
		t.Fatal(err)
	}
	want := `ExecStart=/usr/bin/vmsup --root=/x "--allow-path=/srv/my vms" --qemu-user=vmsup-qemu api serve --config /x/remote/remote.toml`
	if !strings.Contains(svc, want+"\n") {
		t.Errorf("service:\n%s\nwant %s", svc, want)
	}
}
