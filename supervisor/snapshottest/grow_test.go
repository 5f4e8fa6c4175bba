package snapshottest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/ops/plan"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestGrowAfterMerge (issue 48), on a VM with no guest OS (nothing needs
// to boot): a disk in a snapshot is planned as what apply does with its
// growth (it refuses), and once the snapshot is merged away, with the VM
// restarted on the overlay in between so that the merge leaves a node
// QEMU named itself (#blockN) on top of the device, apply grows it: it
// resizes the device's node, not the one the disk booted with.
func TestGrowAfterMerge(t *testing.T) {
	ctx := supervisortest.Context(t, 3*time.Minute)
	dir := t.TempDir()
	body := func(size string) string {
		return fmt.Sprintf(`name = "growvm"
memory = "64M"
accel = "tcg"
stop_timeout = "1ms"
guest_agent = false

[[disk]]
name = "data"
file = %q
size = %q
`, filepath.Join(dir, "data.qcow2"), size)
	}
	sup, f, _ := upVM(t, ctx, "", dir, "growvm", body("8M"))
	if _, err := sup.Snapshot(ctx, "growvm", "s1", supervisor.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Restart(ctx, f); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.Path, []byte(body("16M")), 0o644); err != nil {
		t.Fatal(err)
	}
	g, err := spec.Load(f.Path)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := sup.Plan(ctx, g)
	if err != nil || len(pr.Changes) != 1 || pr.Changes[0].Class != plan.Impossible || !strings.Contains(pr.Changes[0].Why, "in snapshots") {
		t.Fatalf("plan of a disk's growth in a snapshot: %+v %v", pr.Changes, err)
	}
	if _, err := sup.Apply(ctx, g, supervisor.ApplyOptions{}); err == nil || !strings.Contains(err.Error(), "in snapshots") {
		t.Fatalf("apply of a disk's growth in a snapshot: %v", err)
	}
	if err := sup.RemoveSnapshot(ctx, "growvm", "s1", nil); err != nil {
		t.Fatal(err)
	}
	// The merge leaves the device on another node than fmt-data (QEMU's
	// #blockN, or the chain's node of a disk passed as descriptors).
	if blocks := qmpJSON(t, ctx, sup, "growvm", "query-block"); strings.Contains(blocks, `"node-name":"fmt-data"`) {
		t.Fatalf("after the merge the device is still on fmt-data (not the case to test): %s", blocks)
	}
	pr, err = sup.Plan(ctx, g)
	if err != nil || len(pr.Changes) != 1 || pr.Changes[0].Class != plan.Live || pr.Changes[0].Kind != plan.DiskGrow {
		t.Fatalf("plan of the growth after the merge: %+v %v", pr.Changes, err)
	}
	if _, err := sup.Apply(ctx, g, supervisor.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if blocks := qmpJSON(t, ctx, sup, "growvm", "query-block"); !strings.Contains(blocks, fmt.Sprintf(`"virtual-size":%d`, 16<<20)) {
		t.Fatalf("after apply the device's image is not 16M: %s", blocks)
	}
}
