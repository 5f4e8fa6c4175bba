package virtiofs

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// TestUnit: the companion unit runs a (fake) virtiofsd on the share with
// the socket in its own directory; in its sandbox it sees only the share
// (writable only for a writable share) and that directory, as QEMU's user,
// without network.
func TestUnit(t *testing.T) {
	p := PathsFor("/var/lib/vmsup/vms/web", "data")
	for _, ro := range []bool{false, true} {
		sh := spec.Share{Path: "/srv/data", Tag: "data", Driver: spec.ShareVirtioFS, ReadOnly: ro}
		u := Unit("vmsup-fs-data@web.service", "web", "vmsup-web.service", "/usr/libexec/virtiofsd", sh, p,
			"/var/lib/vmsup/vms", &units.Sandbox{User: "vmsupq-web", Group: "vmsupq-web", HostNetwork: true,
				Devices: []units.DeviceRule{{Path: "/dev/kvm", Access: "rw"}}})
		want := []string{"/usr/libexec/virtiofsd", "--socket-path=/var/lib/vmsup/vms/web/virtiofs-data/sock",
			"--shared-dir=/srv/data", "--cache=auto", "--sandbox=none"}
		rw := []string{"/var/lib/vmsup/vms/web/virtiofs-data", "/srv/data"}
		if ro {
			want = append(want, "--readonly")
			rw = rw[:1]
		}
		if diff := cmp.Diff(want, u.Argv); diff != "" {
			t.Errorf("read-only %v: argv (-want +got):\n%s", ro, diff)
		}
		sb := u.Sandbox
		if sb == nil || sb.User != "vmsupq-web" || sb.HostNetwork || len(sb.Devices) > 0 ||
			!slices.Equal(sb.ReadWritePaths, rw) || !slices.Equal(sb.BindPaths, []string{p.Dir, "/srv/data"}) ||
			!slices.Equal(sb.HidePaths, []string{"/var/lib/vmsup/vms"}) {
			t.Errorf("read-only %v: sandbox %+v", ro, sb)
		}
		if !slices.Equal(u.Before, []string{"vmsup-web.service"}) {
			t.Errorf("Before=%v", u.Before)
		}
	}
}
