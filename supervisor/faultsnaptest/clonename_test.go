package faultsnaptest_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// cloneSettledByName: a clone killed after its QEMU started (paused,
// waiting for the snapshot's memory) or before, then only commands on the
// clone's name: status CLONE settles
// the clone's operation (journaled on the template): the clone runs whole
// or is gone, and nothing stays pending on the template; ls shows its QEMU
// if it runs.
func (d *snapVM) cloneSettledByName(t *testing.T, ctx context.Context, on *faultSide) {
	name := d.vm + "-cl"
	d.noClone(t, ctx)
	d.with(t, ctx, "c", true)
	for _, step := range []string{"noted", "unit"} {
		j := d.cloneJob("c")(on)
		j.KillAfter = step
		if killed, out, _ := supervisortest.RunJob(t, ctx, j, 0); !killed {
			t.Fatalf("clone not killed after %q: %s", step, out)
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			st, err := d.sup.Status(ctx, name)
			_, pending := os.Stat(filepath.Join(on.Root, "records", d.vm, "op.json"))
			if (errors.Is(err, supervisor.ErrNotFound) || err == nil && st.State == supervisor.StateRunning) && pending != nil {
				t.Logf("clone killed after %q: status %s settled it: %v %s", step, name, err, st.Recovery)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("clone killed after %q: status %s does not settle it: %s (%s), %v; template's journal: %v",
					step, name, st.State, st.Reason, err, pending)
			}
		}
		unit := "vmsup-" + name + ".service"
		list, err := d.sup.List(ctx)
		if err != nil {
			t.Fatalf("ls after a killed clone: %v", err)
		}
		if supervisortest.QEMUPID(on.SD, unit) > 0 && !listed(list, name) {
			t.Fatalf("after a clone killed after %q its QEMU runs and ls does not show it", step)
		}
		d.checkClone(t, ctx, "c")
		d.noClone(t, ctx)
	}
	// A whole clone, then rm --delete-disks (noClone): its overlays go, and
	// it clones again under its name.
	for range 2 {
		if _, err := d.sup.UpFromSnapshot(ctx, d.vm, "c", name); err != nil {
			t.Fatalf("clone after rm --delete-disks: %v", err)
		}
		d.noClone(t, ctx)
	}
}

func listed(list []supervisor.Status, name string) bool {
	for _, s := range list {
		if s.Name == name {
			return true
		}
	}
	return false
}
