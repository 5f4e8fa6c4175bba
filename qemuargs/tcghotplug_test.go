package qemuargs

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
)

// TestTCGHotplugSingleThread: a TCG VM that can hot-plug vCPUs runs TCG
// single-threaded, and a vCPU hot-plugged into it shares the one vCPU
// thread: it takes no region of the translation buffer of its own, whose
// exhaustion aborted QEMU (tcg_region_initial_alloc__locked) when each
// vCPU had its own thread. Without hotplug, and under KVM, nothing changes.
func TestTCGHotplugSingleThread(t *testing.T) {
	accelOf := func(vm *spec.VM, a spec.Accel) string {
		o := testOptions
		o.Accel, vm.Accel = a, a
		argv, err := Build(vm, o)
		if err != nil {
			t.Fatal(err)
		}
		return argv[slices.Index(argv, "-accel")+1]
	}
	const disk = "[[disk]]\nname = \"root\"\nfile = \"root.img\"\n"
	hot := validVM(t, "cpus = 1\nmax_cpus = 2\n"+disk)
	if got := accelOf(hot, spec.AccelTCG); !strings.HasSuffix(got, ",thread=single") {
		t.Errorf("TCG with max_cpus > cpus: -accel %s, want thread=single", got)
	}
	if got := accelOf(hot, spec.AccelKVM); got != "kvm" {
		t.Errorf("KVM with max_cpus > cpus: -accel %s", got)
	}
	if got := accelOf(validVM(t, "cpus = 2\n"+disk), spec.AccelTCG); strings.Contains(got, "thread=") {
		t.Errorf("TCG without hotplug: -accel %s, want multi-threaded TCG", got)
	}

	env := needQEMU(t)
	tmp, err := os.MkdirTemp("", "qemuargs-tcgcpu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	o := Options{Binary: env.qemu, Accel: spec.AccelTCG, QMPSocket: tmp + "/qmp.sock",
		EventSocket: tmp + "/events.sock", ConsoleSocket: tmp + "/console.sock"}
	vm := validVM(t, "cpus = 1\nmax_cpus = 2\nguest_agent = false\n"+disk)
	vm.Disks[0].File = tmp + "/root.img"
	if err := os.WriteFile(vm.Disks[0].File, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	argv, err := Build(vm, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, q := startQEMU(ctx, t, argv, o.QMPSocket)
	type slot struct {
		Type    string         `json:"type"`
		Props   map[string]any `json:"props"`
		QOMPath string         `json:"qom-path"`
	}
	var slots []slot
	if err := q.run("query-hotpluggable-cpus", nil, &slots); err != nil {
		p.fail("%v", err)
	}
	i := slices.IndexFunc(slots, func(s slot) bool { return s.QOMPath == "" })
	if i < 0 {
		p.fail("no free vCPU slot: %+v", slots)
	}
	args := map[string]any{"driver": slots[i].Type, "id": "vcpu-hot"}
	for k, v := range slots[i].Props {
		args[k] = v
	}
	if err := q.run("device_add", args, nil); err != nil {
		p.fail("device_add: %v", err)
	}
	var cpus []struct {
		ThreadID int `json:"thread-id"`
	}
	if err := q.run("query-cpus-fast", nil, &cpus); err != nil {
		p.fail("%v", err)
	}
	if len(cpus) != 2 || cpus[0].ThreadID != cpus[1].ThreadID {
		p.fail("vCPUs after the hot-plug: %+v, want 2 on one thread", cpus)
	}
	p.quit(ctx, q)
}
