package storage

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
)

func needQemuImg(t *testing.T) Tools {
	t.Helper()
	p, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("qemu-img is not installed (apt-get install qemu-utils)")
	}
	return Tools{QemuImg: p}
}

func qemuImg(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
	}
}

func fileDisk(name, file string, mod func(*spec.Disk)) spec.Disk {
	d := spec.Disk{Name: name, Type: spec.DiskFile, File: file, Format: spec.FormatQcow2, Cache: "writeback", AIO: "threads"}
	if mod != nil {
		mod(&d)
	}
	return d
}

// TestCheckAndPrepareFiles: an overlay is created on a base that is never
// written; each bad input is one line naming the disk.
func TestCheckAndPrepareFiles(t *testing.T) {
	tools := needQemuImg(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", base, "64M")
	mid := filepath.Join(dir, "mid.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", mid)
	gone := filepath.Join(dir, "gone.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", gone, "64M")
	orphan := filepath.Join(dir, "orphan.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-b", gone, "-F", "qcow2", orphan)
	os.Remove(gone)

	// A good overlay on a two-level chain.
	top := filepath.Join(dir, "vm1.qcow2")
	d := fileDisk("root", top, func(d *spec.Disk) { d.Backing = mid; d.Size = 128 * spec.MiB })
	if err := tools.Check(ctx, d); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(base)
	p, err := tools.Prepare(ctx, d, dir)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := tools.Chain(ctx, top, "qcow2")
	if err != nil || len(chain) != 3 || chain[1].Filename != mid || chain[2].Filename != base || chain[0].VirtualSize != 128<<20 {
		t.Fatalf("chain %+v %v", chain, err)
	}
	if after, _ := os.ReadFile(base); string(after) != string(before) {
		t.Error("base image changed")
	}
	p.Undo()
	if _, err := os.Stat(top); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Undo left %s", top)
	}

	for _, c := range []struct {
		name string
		d    spec.Disk
		want string
	}{
		{"missing base", fileDisk("root", top, func(d *spec.Disk) { d.Backing = filepath.Join(dir, "nobase.qcow2") }),
			`disk "root": base image ` + dir + `/nobase.qcow2: no such file`},
		{"missing backing in chain", fileDisk("old", orphan, nil),
			`disk "old": backing file ` + gone + ` (of ` + orphan + `): no such file`},
		{"missing backing of base", fileDisk("root", top, func(d *spec.Disk) { d.Backing = orphan }),
			`disk "root": base image: backing file ` + gone + ` (of ` + orphan + `): no such file`},
		{"smaller than base", fileDisk("root", top, func(d *spec.Disk) { d.Backing = base; d.Size = 32 * spec.MiB }),
			`disk "root": size 32M is smaller than its base image ` + base + ` (64M): an overlay cannot shrink its base`},
		{"no size", fileDisk("data", filepath.Join(dir, "new.img"), func(d *spec.Disk) { d.Format = "raw" }),
			`disk "data": ` + dir + `/new.img: no such file (give size, or backing, to have vmsup create it)`},
		{"not a block device", spec.Disk{Name: "blk", Type: spec.DiskBlock, File: base, Format: "raw"},
			`disk "blk": ` + base + ` is not a block device`},
		{"portal unreachable", spec.Disk{Name: "lun", Type: spec.DiskISCSI, Portal: "127.0.0.1:1", Target: "iqn.2026-01.x:y"},
			`disk "lun": iSCSI portal 127.0.0.1:1 unreachable: connect: connection refused`},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := tools.Check(ctx, c.d)
			var se *Error
			if !errors.As(err, &se) {
				t.Fatalf("Check = %v, want *Error", err)
			}
			if !strings.HasPrefix(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("Check error\n%q\nwant prefix\n%q", err, c.want)
			}
		})
	}
}
