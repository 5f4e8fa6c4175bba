// Package apply makes a running VM match its file. Plan compares the file
// with the VM as it runs (the running view; internal/ops/plan classes each
// difference) and Apply makes each difference the cheapest way QEMU
// allows: live, at the guest's next reboot, or by a health-gated restart.
// It also owns the live changes apply makes itself: the settings QEMU
// takes over QMP only (I/O limits, links, pinning, the balloon; the start
// pipeline and a migration destination give them too: Runtime), a
// setting's change ("apply-set"), and live vCPU and memory resizes
// ("set", vmsup set). Each runs as an operation of the kernel
// (internal/lifecycle/operation) with its recoverer, registered by
// Applier.Register, so an apply killed between two changes leaves a
// record that says what QEMU has, and the next plan goes on from there.
//
// It does not own the VM's lifecycle: the checks of a file and its owner,
// a restart, autostart, the confinement's grants and the unit's limits are
// internal/machine's Env, which it calls down to; the hot-plugs are
// internal/ops/hotplug's (with fromFile). The guardian that starts the VM
// again once its guest rebooted (with what apply left pending) is the
// Env's too (RebootApply, given RebootFile).
package apply
