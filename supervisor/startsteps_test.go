package supervisor_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// TestStartSteps: up and both kinds of migration destination build their
// steps from one list; what differs is said by the mode.
func TestStartSteps(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinux")
	os.WriteFile(kernel, []byte("k"), 0o644)
	f, err := spec.Parse(filepath.Join(dir, "s.toml"), []byte(`name = "s"
memory = "256M"
[boot]
kernel = "`+kernel+`"
[[nic]]
name = "pod"
type = "cni"
cni_config = "/etc/cni/net.d/x.conflist"
[[nic]]
name = "pod2"
type = "cni"
cni_config = "/etc/cni/net.d/y.conflist"
`))
	if err != nil {
		t.Fatal(err)
	}
	sup, err := supervisor.New(supervisor.Options{Root: t.TempDir(), Self: "/bin/true", Host: &supervisor.Host{KVMUnusable: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	host := `images storage net-check netns nic "pod" nic "pod2" boot-files confine`
	for mode, want := range map[supervisor.StartMode]string{
		supervisor.StartFresh:         `validate lock check state-dir ` + host + ` argv record console-log unit disks confirm`,
		supervisor.StartIncoming:      `validate lock check state-dir ` + host + ` argv record console-log unit disks incoming`,
		supervisor.StartIncomingLocal: `validate check state-dir reuse move taps argv record console-log unit disks incoming`,
	} {
		got := strings.Join(sup.StartSteps(f, mode), " ")
		t.Logf("%s: %s", mode, got)
		if got != want {
			t.Errorf("%s:\n got %s\nwant %s", mode, got, want)
		}
	}
}
