package faulttest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/testenv"
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

// TestFaultsMigrate: migrate --local, then across two hosts (each way),
// killed after every step of the source's side and at random times.
func TestFaultsMigrate(t *testing.T) {
	ctx := supervisortest.Context(t, 25*time.Minute)
	ha, hb := supervisortest.TwoHosts(t, env, vmsupBin)
	dir := t.TempDir()
	const vm = "fmig"
	f := supervisortest.MigrationGuest(t, env, dir, vm, "256M", filepath.Join(dir, "shared-data.raw"))
	if _, err := ha.Sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ha.Sup.Down(context.Background(), vm)
		hb.Sup.Down(context.Background(), vm)
	})
	st, _ := ha.Sup.Status(ctx, vm)
	testenv.WaitLog(t, st.ConsoleLog, "VMSUP-COUNTER", 90*time.Second)
	a := sideOf(t, "A", ha.SD, ha.Root, ha.UnitDir(), ha.Sup)
	b := sideOf(t, "B", hb.SD, hb.Root, hb.UnitDir(), hb.Sup)
	host := map[*faultSide]*supervisortest.Host{a: ha, b: hb}
	var counts []string
	none := func(*testing.T, context.Context, *faultSide) {}
	t.Run("local", func(t *testing.T) {
		n := runFaults(t, ctx, faultOp{name: "migrate-local", vm: vm, sides: []*faultSide{a}, random: randomKills, markers: dir, before: none,
			job: func(on *faultSide) faultJob {
				j := on.Job
				j.Op, j.VM = "migrate-local", vm
				return j
			},
			again: func(t *testing.T, ctx context.Context, on *faultSide, _ supervisor.Status) {
				if _, err := on.Sup.Migrate(ctx, vm, supervisor.MigrateOptions{Local: true}); err != nil {
					t.Fatalf("the next migration: %v", err)
				}
			}})
		counts = append(counts, fmt.Sprintf("local %d+%d", n.stepKills, n.randomKills+n.randomMissed))
	})
	if t.Failed() {
		return
	}
	other := func(on *faultSide) *faultSide {
		if on == a {
			return b
		}
		return a
	}
	opts := func(from *faultSide) supervisor.MigrateOptions {
		to := host[other(from)]
		return supervisor.MigrateOptions{To: to.Name, Address: to.Addr, Transport: to.Transport(""), Dial: host[from].Dial}
	}
	t.Run("cross-host", func(t *testing.T) {
		n := runFaults(t, ctx, faultOp{name: "migrate", vm: vm, sides: []*faultSide{a, b}, random: randomKills, markers: dir, before: none,
			job: func(on *faultSide) faultJob {
				o := opts(on)
				j := on.Job
				j.Op, j.VM, j.To, j.Address, j.Transport, j.DialNetns = "migrate", vm, o.To, o.Address, o.Transport, host[on].Netns
				return j
			},
			again: func(t *testing.T, ctx context.Context, on *faultSide, _ supervisor.Status) {
				if _, err := on.Sup.Migrate(ctx, vm, opts(on)); err != nil {
					t.Fatalf("the next migration (%s -> %s): %v", on.Name, other(on).Name, err)
				}
			}})
		counts = append(counts, fmt.Sprintf("cross-host %d+%d", n.stepKills, n.randomKills+n.randomMissed))
	})
	if t.Failed() {
		return
	}
	t.Run("receiver-killed", func(t *testing.T) {
		// The destination's receiver dies mid-stream (SIGKILL): the source
		// runs on, and the destination's guardian tears its QEMU down.
		op := faultOp{name: "receiver-killed", vm: vm, sides: []*faultSide{a, b}, markers: dir}
		for i := range 5 {
			on := settle(t, ctx, op, nil)
			to := other(on)
			pidf := filepath.Join(t.TempDir(), "pid")
			o := opts(on)
			o.Transport = host[to].Transport("", "sh", "-c", `echo $$ >`+pidf+`; exec "$@"`, "sh")
			o.Bandwidth = 8 << 20 // a stream long enough to be cut
			delay := time.Duration(200+150*i) * time.Millisecond
			sup := host[on].WithHook(t, supervisortest.AfterPrepared(delay, func() {
				b, _ := os.ReadFile(pidf)
				var pid int
				fmt.Sscan(string(b), &pid)
				if pid > 0 {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}))
			_, err := sup.Migrate(ctx, vm, o)
			t.Logf("receiver on %s killed %s after prepare: %v", to.Name, delay, err)
			after := settle(t, ctx, op, nil)
			if err != nil && after != on {
				t.Fatalf("the migration failed but the guest runs on %s", after.Name)
			}
		}
		counts = append(counts, "receiver-killed 5")
	})
	t.Logf("FAULTS migrate (step kills + random kills): %s", strings.Join(counts, ", "))
}
