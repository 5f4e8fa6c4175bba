package faulttest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// faultBridge is the Linux bridge the fault suite's NICs plug into, in the
// package's private network namespace (TestMain).
const faultBridge = "vmsfltbr0"

// TestFaultsHotplug: disk attach and detach, NIC attach and detach, set and
// restart, each killed after every step and at random times.
func TestFaultsHotplug(t *testing.T) {
	ctx := supervisortest.Context(t, 25*time.Minute)
	root := t.TempDir()
	a := sideOf(t, "A", env.Systemd, root, filepath.Join(root, "etc-systemd"), nil)
	const vm = "fhot"
	h := supervisortest.NewHotVM(t, ctx, env, a.Sup, root, vm, faultBridge)
	job := func(op string, edit func(*faultJob)) func(*faultSide) faultJob {
		return func(on *faultSide) faultJob {
			j := on.Job
			j.Op, j.VM = op, vm
			edit(&j)
			return j
		}
	}
	var counts []string
	run := func(op faultOp) {
		t.Run(op.name, func(t *testing.T) {
			op.vm, op.sides = vm, []*faultSide{a}
			if op.random == 0 {
				op.random = randomKills
			}
			n := runFaults(t, ctx, op)
			counts = append(counts, fmt.Sprintf("%s %d+%d", op.name, n.stepKills, n.randomKills+n.randomMissed))
		})
	}
	run(faultOp{name: "disk-attach", job: job("disk-attach", func(j *faultJob) { j.Disk = h.Disk }),
		before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if h.HasDisk(h.Status(t, ctx)) {
				h.Detach(t, ctx)
			}
		},
		check: h.CheckDisk,
		again: func(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
			if !h.HasDisk(st) {
				h.Attach(t, ctx) // repeat
			}
			h.Detach(t, ctx) // and back
		}})
	run(faultOp{name: "disk-detach", job: job("disk-detach", func(j *faultJob) { j.Disk = h.Disk }),
		before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if !h.HasDisk(h.Status(t, ctx)) {
				h.Attach(t, ctx)
			}
		},
		check: h.CheckDisk,
		again: func(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
			if h.HasDisk(st) {
				h.Detach(t, ctx) // repeat
			} else {
				os.Remove(h.Disk.File)
			}
		}})
	run(faultOp{name: "nic-attach", job: job("nic-attach", func(j *faultJob) { j.NIC = &h.NIC }),
		before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if h.HasNIC(h.Status(t, ctx)) {
				h.NICDetach(t, ctx)
			}
		},
		check: h.CheckNIC,
		again: func(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
			if !h.HasNIC(st) {
				h.NICAttach(t, ctx)
			}
			h.NICDetach(t, ctx)
		}})
	run(faultOp{name: "nic-detach", job: job("nic-detach", func(j *faultJob) { j.NIC = &h.NIC }),
		before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if !h.HasNIC(h.Status(t, ctx)) {
				h.NICAttach(t, ctx)
			}
		},
		check: h.CheckNIC,
		again: func(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
			if h.HasNIC(st) {
				h.NICDetach(t, ctx)
			}
		}})
	run(faultOp{name: "set", job: job("set", func(j *faultJob) { j.Memory = supervisortest.BigMem }),
		before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if h.Status(t, ctx).Memory != supervisortest.SmallMem.String() {
				h.SetMem(t, ctx, supervisortest.SmallMem)
			}
		},
		check: h.CheckMem,
		again: func(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
			if st.Memory != supervisortest.BigMem.String() {
				h.SetMem(t, ctx, supervisortest.BigMem) // repeat
			}
			h.SetMem(t, ctx, supervisortest.SmallMem) // and back
		}})
	run(faultOp{name: "restart", job: job("restart", func(j *faultJob) { j.File = h.File.Path }),
		before: func(t *testing.T, ctx context.Context, _ *faultSide) {},
		check:  h.CheckAll,
		again: func(t *testing.T, ctx context.Context, on *faultSide, st supervisor.Status) {
			// (the next settle sees its guest's counter move)
			if _, err := h.Sup.Restart(ctx, h.File); err != nil {
				t.Fatalf("restart again: %v", err)
			}
		}})
	// An ACPI reboot tells QEMU to pause, not exit, on the guest's
	// poweroff: killed anywhere, it must be finished (by its guardian) and
	// QEMU's poweroff action given back. (Its random kills also found that
	// TCG's translation buffer, 1 GiB by default, outgrew the unit's
	// MemoryMax after a few reboots: qemuargs bounds it now.)
	run(faultOp{name: "reboot", job: job("reboot", func(*faultJob) {}),
		before: func(t *testing.T, ctx context.Context, _ *faultSide) { h.WaitAgent(t, ctx) },
		check: func(t *testing.T, ctx context.Context, on *faultSide, st supervisor.Status) {
			if st.QEMUStatus != "running" {
				t.Fatalf("QEMU %s after an interrupted reboot", st.QEMUStatus)
			}
			h.CheckAll(t, ctx, on, st)
		}})
	// ... so a guest poweroff now ends QEMU (a left "pause" action would
	// keep it, and down would have to quit it).
	h.WaitAgent(t, ctx)
	if r, err := h.Sup.Down(ctx, h.VM); err != nil || r.Step != supervisor.StoppedACPI {
		t.Fatalf("down after the reboot faults: %s, %v (want the guest's own ACPI poweroff)", r.Step, err)
	}
	t.Logf("FAULTS hotplug (step kills + random kills): %s", strings.Join(counts, ", "))
}
