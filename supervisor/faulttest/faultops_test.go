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
	run := func(op supervisortest.FaultOp) {
		t.Run(op.Name, func(t *testing.T) {
			op.VM, op.Sides = vm, []*faultSide{a}
			if op.Random == 0 {
				op.Random = supervisortest.RandomKills
			}
			n := supervisortest.RunFaults(t, ctx, op)
			counts = append(counts, fmt.Sprintf("%s %d+%d", op.Name, n.StepKills, n.RandomKills+n.RandomMissed))
		})
	}
	run(supervisortest.FaultOp{Name: "disk-attach", Job: job("disk-attach", func(j *faultJob) { j.Disk = h.Disk }),
		Before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if h.HasDisk(h.Status(t, ctx)) {
				h.Detach(t, ctx)
			}
		},
		Check: h.CheckDisk,
		Again: func(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
			if !h.HasDisk(st) {
				h.Attach(t, ctx) // repeat
			}
			h.Detach(t, ctx) // and back
		}})
	run(supervisortest.FaultOp{Name: "disk-detach", Job: job("disk-detach", func(j *faultJob) { j.Disk = h.Disk }),
		Before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if !h.HasDisk(h.Status(t, ctx)) {
				h.Attach(t, ctx)
			}
		},
		Check: h.CheckDisk,
		Again: func(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
			if h.HasDisk(st) {
				h.Detach(t, ctx) // repeat
			} else {
				os.Remove(h.Disk.File)
			}
		}})
	run(supervisortest.FaultOp{Name: "nic-attach", Job: job("nic-attach", func(j *faultJob) { j.NIC = &h.NIC }),
		Before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if h.HasNIC(h.Status(t, ctx)) {
				h.NICDetach(t, ctx)
			}
		},
		Check: h.CheckNIC,
		Again: func(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
			if !h.HasNIC(st) {
				h.NICAttach(t, ctx)
			}
			h.NICDetach(t, ctx)
		}})
	run(supervisortest.FaultOp{Name: "nic-detach", Job: job("nic-detach", func(j *faultJob) { j.NIC = &h.NIC }),
		Before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if !h.HasNIC(h.Status(t, ctx)) {
				h.NICAttach(t, ctx)
			}
		},
		Check: h.CheckNIC,
		Again: func(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
			if h.HasNIC(st) {
				h.NICDetach(t, ctx)
			}
		}})
	run(supervisortest.FaultOp{Name: "set", Job: job("set", func(j *faultJob) { j.Memory = supervisortest.BigMem }),
		Before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if h.Status(t, ctx).Memory != supervisortest.SmallMem.String() {
				h.SetMem(t, ctx, supervisortest.SmallMem)
			}
		},
		Check: h.CheckMem,
		Again: func(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
			if st.Memory != supervisortest.BigMem.String() {
				h.SetMem(t, ctx, supervisortest.BigMem) // repeat
			}
			h.SetMem(t, ctx, supervisortest.SmallMem) // and back
		}})
	run(supervisortest.FaultOp{Name: "restart", Job: job("restart", func(j *faultJob) { j.File = h.File.Path }),
		Before: func(t *testing.T, ctx context.Context, _ *faultSide) {},
		Check:  h.CheckAll,
		Again: func(t *testing.T, ctx context.Context, on *faultSide, st supervisor.Status) {
			// (the next settle sees its guest's counter move)
			if _, err := h.Sup.Restart(ctx, h.File); err != nil {
				t.Fatalf("restart Again: %v", err)
			}
		}})
	// An ACPI reboot tells QEMU to pause, not exit, on the guest's
	// poweroff: killed anywhere, it must be finished (by its guardian) and
	// QEMU's poweroff action given back. (Its random kills also found that
	// TCG's translation buffer, 1 GiB by default, outgrew the unit's
	// MemoryMax after a few reboots: qemuargs bounds it now.)
	run(supervisortest.FaultOp{Name: "reboot", Job: job("reboot", func(*faultJob) {}),
		Before: func(t *testing.T, ctx context.Context, _ *faultSide) { h.WaitAgent(t, ctx) },
		Check: func(t *testing.T, ctx context.Context, on *faultSide, st supervisor.Status) {
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
