package qmp

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// An NBD export of a node with its dirty bitmap: an external client (qemu-img
// map with x-dirty-bitmap) sees which extents the guest wrote.
func TestQEMUNBDBitmapExport(t *testing.T) {
	t.Parallel()
	_, c, _ := diskQEMU(t, "4M")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	qemuIO(t, c, "disk0", "write -P 0x11 0 4M")
	if err := c.BlockDirtyBitmapAdd(ctx, BitmapAdd{Node: "base", Name: "b0"}); err != nil {
		t.Fatal(err)
	}
	qemuIO(t, c, "disk0", "write -P 0x5a 1M 64k")
	qemuIO(t, c, "disk0", "write -P 0x5a 3M 128k")

	sock := filepath.Join(shortTempDir(t), "nbd.sock")
	if err := c.NBDServerStart(ctx, sock); err != nil {
		t.Fatalf("NBDServerStart: %v", err)
	}
	export := BlockExport{ID: "e0", NodeName: "base", Name: "disk", Bitmaps: []string{"b0"}}
	// A read-only export takes only a bitmap that no longer records.
	err := c.BlockExportAdd(ctx, export)
	if !IsClass(err, ClassGenericError) || !strings.Contains(err.Error(), "incompatible with readonly export") {
		t.Errorf("BlockExportAdd with a recording bitmap = %v, want refused", err)
	}
	if err := c.BlockDirtyBitmapDisable(ctx, "base", "b0"); err != nil {
		t.Fatal(err)
	}
	if err := c.BlockExportAdd(ctx, export); err != nil {
		t.Fatalf("BlockExportAdd: %v", err)
	}
	es, err := c.QueryBlockExports(ctx)
	if err != nil || len(es) != 1 || es[0] != (ExportInfo{ID: "e0", Type: "nbd", NodeName: "base"}) {
		t.Errorf("QueryBlockExports = %+v, %v", es, err)
	}
	if b := bitmapOf(t, c, "base", "b0"); !b.Busy || b.Recording {
		t.Errorf("exported bitmap = %+v, want busy and not recording", b)
	}

	start := time.Now()
	opts := "driver=nbd,server.type=unix,server.path=" + sock + ",export=disk,x-dirty-bitmap=qemu:dirty-bitmap:b0"
	out := qemuImg(t, "map", "--output=json", "--image-opts", opts)
	t.Logf("qemu-img map of the bitmap (%v): %s", time.Since(start), out)
	var ex []mapExtent
	if err := json.Unmarshal([]byte(out), &ex); err != nil {
		t.Fatal(err)
	}
	// x-dirty-bitmap reports dirty extents as "data": false (NBD's dirty
	// bit is where the hole bit of base:allocation is).
	var dirty []mapExtent
	for _, e := range ex {
		if !e.Data {
			dirty = append(dirty, mapExtent{Start: e.Start, Length: e.Length})
		}
	}
	want := []mapExtent{{Start: 1 << 20, Length: 64 << 10}, {Start: 3 << 20, Length: 128 << 10}}
	if !slices.Equal(dirty, want) {
		t.Errorf("dirty extents over NBD = %+v, want %+v", dirty, want)
	}
	// The export's data is the node's.
	info := qemuImg(t, "info", "--output=json", "--image-opts", "driver=nbd,server.type=unix,server.path="+sock+",export=disk")
	if !strings.Contains(info, `"virtual-size": 4194304`) {
		t.Errorf("qemu-img info over NBD: %s", info)
	}

	sub, unsub := c.Subscribe(ctx)
	defer unsub()
	if err := c.BlockExportDel(ctx, "e0", false); err != nil {
		t.Fatalf("BlockExportDel: %v", err)
	}
	if _, err := WaitEvent(ctx, sub, "BLOCK_EXPORT_DELETED", nil); err != nil {
		t.Fatal(err)
	}
	if es, err := c.QueryBlockExports(ctx); err != nil || len(es) != 0 {
		t.Errorf("QueryBlockExports after delete = %+v, %v", es, err)
	}
	if err := c.NBDServerStop(ctx); err != nil {
		t.Fatalf("NBDServerStop: %v", err)
	}
	if b := bitmapOf(t, c, "base", "b0"); b.Busy || b.Count != 192<<10 {
		t.Errorf("bitmap after the export = %+v, want free with 192 KiB dirty", b)
	}
}
