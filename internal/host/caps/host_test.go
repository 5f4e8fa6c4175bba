package caps

import (
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

func TestResolveAccel(t *testing.T) {
	pvm := Host{KVMOpenable: true, KVMUnusable: "/dev/kvm is PVM (kvm_pvm), which runs only PVM guest kernels"}
	real := Host{KVMOpenable: true}
	none := Host{KVMUnusable: "no /dev/kvm"}
	cases := []struct {
		accel   spec.Accel
		host    Host
		want    spec.Accel
		wantErr string
	}{
		{spec.AccelAuto, real, spec.AccelKVM, ""},
		{spec.AccelAuto, pvm, spec.AccelTCG, ""}, // auto never picks a KVM that cannot boot a stock guest
		{spec.AccelAuto, none, spec.AccelTCG, ""},
		{spec.AccelKVM, pvm, spec.AccelKVM, ""}, // asked for explicitly: QEMU starts on it
		{spec.AccelKVM, none, "", "web.toml: accel: kvm requested but no /dev/kvm"},
		{spec.AccelTCG, real, spec.AccelTCG, ""},
	}
	for _, c := range cases {
		f := &spec.File{Path: "web.toml", VM: spec.VM{Accel: c.accel}}
		got, reason, err := c.host.Accel(f)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s on %+v: err %v, want %q", c.accel, c.host, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s on %+v: %s %v, want %s", c.accel, c.host, got, err, c.want)
		}
		if got == spec.AccelTCG && c.accel == spec.AccelAuto && c.host.KVMUnusable != "" && !strings.Contains(reason, c.host.KVMUnusable) {
			t.Errorf("auto->tcg reason %q does not say why", reason)
		}
	}
}

// TestParsePhysBits reads the host CPU's physical address width from
// /proc/cpuinfo's text.
func TestParsePhysBits(t *testing.T) {
	if got := parsePhysBits("model name\t: x\naddress sizes\t: 39 bits physical, 48 bits virtual\n"); got != 39 {
		t.Errorf("got %d, want 39", got)
	}
	if got := parsePhysBits("flags\t: fpu\n"); got != 0 {
		t.Errorf("no address sizes: got %d, want 0", got)
	}
}
