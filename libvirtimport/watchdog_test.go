package libvirtimport

import (
	"os"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// TestWatchdogModels: libvirt's itco and ib700 watchdogs are carried as
// watchdog_model with their action (they were listed as not carried); an
// i6300esb is the default model; a model vmsup lacks is listed.
func TestWatchdogModels(t *testing.T) {
	itco, err := os.ReadFile("../testdata/import/corpus/watchdog-itco.xml")
	if err != nil {
		t.Fatal(err)
	}
	_, vm, lines := convertLoads(t, string(itco), Options{})
	if vm.Watchdog != "reset" || vm.WatchdogModel != spec.WatchdogITCO || strings.Contains(lines, "watchdog") {
		t.Errorf("itco: watchdog %q model %q, lines:\n%s", vm.Watchdog, vm.WatchdogModel, lines)
	}
	dom := func(model, action string) string {
		return `<domain type='kvm'><name>w</name><memory unit='MiB'>512</memory><vcpu>1</vcpu><devices>` +
			`<disk type='file'><driver name='qemu' type='raw'/><source file='/i/a.img'/><target dev='vda' bus='virtio'/></disk>` +
			`<watchdog model='` + model + `' action='` + action + `'/></devices></domain>`
	}
	for _, c := range []struct{ model, action, want, wantAction, line string }{
		{"ib700", "poweroff", spec.WatchdogIB700, "poweroff", ""},
		{"i6300esb", "pause", spec.WatchdogI6300ESB, "pause", ""},
		{"diag288", "reset", "", "", `model "diag288", action "reset": not carried over, vmsup has no such watchdog`},
	} {
		_, vm, lines := convertLoads(t, dom(c.model, c.action), Options{})
		if vm.WatchdogModel != c.want || vm.Watchdog != c.wantAction || c.line != "" && !strings.Contains(lines, c.line) {
			t.Errorf("%s: watchdog %q model %q, lines:\n%s", c.model, vm.Watchdog, vm.WatchdogModel, lines)
		}
	}
}
