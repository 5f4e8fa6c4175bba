package snapshottest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestNBDExport: an external client (qemu-img, not vmsup) reads a running
// guest's disk over vmsup's NBD export as it was when the export began,
// while the guest writes on; the next export's dirty bitmap shows exactly
// what changed since the first export's moment; when the export ends no
// job, export or fleece file is left, and a vmsup killed while serving is
// taken down by the next command.
func TestNBDExport(t *testing.T) {
	ctx := supervisortest.Context(t, 5*time.Minute)
	dir := t.TempDir()
	body := fmt.Sprintf(`name = "nbdvm"
memory = "128M"
accel = "tcg"
stop_timeout = "20s"

[[disk]]
name = "data"
file = %q
size = "16M"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check"
`, filepath.Join(dir, "data.qcow2"), env.Guest.Kernel, env.Guest.Initrd)
	sup, _, st := upVM(t, ctx, "", dir, "nbdvm", body)
	sh := supervisortest.Shell(t, ctx, st)
	write := func(pattern string, mib int) {
		t.Helper()
		cmd := fmt.Sprintf("printf %s | dd of=/dev/vda bs=1M seek=%d conv=notrunc 2>/dev/null && sync", pattern, mib)
		if _, _, err := sh.Run(ctx, cmd); err != nil {
			t.Fatal(err)
		}
	}
	write("AAAAAAAA", 0)

	sock := filepath.Join(dir, "nbd.sock")
	serve := func() (supervisor.ExportInfo, func()) {
		t.Helper()
		ectx, stop := context.WithCancel(ctx)
		ready, done := make(chan supervisor.ExportInfo, 1), make(chan error, 1)
		go func() {
			done <- sup.ExportNBD(ectx, "nbdvm", supervisor.ExportOptions{Socket: sock, Ready: func(x supervisor.ExportInfo) { ready <- x }})
		}()
		select {
		case x := <-ready:
			return x, func() {
				stop()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
		case err := <-done:
			stop()
			t.Fatalf("export: %v", err)
		}
		return supervisor.ExportInfo{}, nil
	}
	x, stop := serve()
	t.Logf("first export: %+v", x)
	if x.Exports[0].Bitmap != "" {
		t.Fatalf("a first export with a bitmap: %+v", x)
	}
	// The guest writes on; the export still reads the moment it began.
	write("BBBBBBBB", 0)
	if got := readNBD(t, ctx, sock, "data", 8); got != "AAAAAAAA" {
		t.Fatalf("the export reads %q, want the moment it began (AAAAAAAA)", got)
	}
	stop()
	if l := leftovers(t, ctx, sup, "nbdvm"); l != "" {
		t.Fatalf("after the export: %s", l)
	}
	if _, err := os.Stat(sock); err == nil {
		t.Fatal("the socket is left")
	}

	write("CCCCCCCC", 5)
	x, stop = serve()
	t.Logf("second export: %+v", x)
	bm := x.Exports[0].Bitmap
	if bm == "" {
		t.Fatalf("the second export has no bitmap: %+v", x)
	}
	dirty := dirtyMiB(t, ctx, sock, "data", bm)
	// B (MiB 0) came after the first export's moment, then C (MiB 5).
	if strings.Join(dirty, ",") != "0,5" {
		t.Fatalf("dirty MiB per the bitmap: %v, want 0 and 5", dirty)
	}
	if got := readNBD(t, ctx, sock, "data", 8); got != "BBBBBBBB" {
		t.Fatalf("the second export reads %q", got)
	}
	stop()

	// vmsup killed while it serves: the export lives on until the next
	// command takes it down, and the bitmap counts on from the second
	// export's moment (the killed one's client may not have finished).
	cmd := exec.CommandContext(ctx, os.Args[0], "-crash-helper", sup.Root(), env.Systemd.BusAddress, vmsupBin, "nbdvm", sock, "nbd", "export")
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("the helper was not killed:\n%s", out)
	}
	if got := readNBD(t, ctx, sock, "data", 8); got != "BBBBBBBB" {
		t.Fatalf("the orphaned export reads %q", got)
	}
	if err := sup.Pause(ctx, "nbdvm"); err != nil { // the next command recovers
		t.Fatal(err)
	}
	if err := sup.Resume(ctx, "nbdvm"); err != nil {
		t.Fatal(err)
	}
	if l := leftovers(t, ctx, sup, "nbdvm"); l != "" {
		t.Fatalf("after recovering a killed export: %s", l)
	}
	write("DDDDDDDD", 9)
	x, stop = serve()
	if got := dirtyMiB(t, ctx, sock, "data", x.Exports[0].Bitmap); strings.Join(got, ",") != "9" {
		t.Fatalf("after the killed export, dirty MiB %v (bitmap %s), want 9", got, x.Exports[0].Bitmap)
	}
	stop()
}

// readNBD reads the first n bytes of an export with qemu-img (an NBD
// client that is not vmsup).
func readNBD(t *testing.T, ctx context.Context, sock, export string, n int) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "read.raw")
	img := fmt.Sprintf("driver=nbd,server.type=unix,server.path=%s,export=%s", sock, export)
	if b, err := exec.CommandContext(ctx, "qemu-img", "dd", "--image-opts", "-O", "raw", "bs=512", "count=1", "if="+img, "of="+out).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img dd over NBD: %v %s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil || len(b) < n {
		t.Fatalf("read %d bytes (%v)", len(b), err)
	}
	return string(b[:n])
}

// dirtyMiB lists the MiB the export's bitmap marks dirty (qemu-img map
// shows them as "data": false under x-dirty-bitmap).
func dirtyMiB(t *testing.T, ctx context.Context, sock, export, bitmap string) []string {
	t.Helper()
	img := fmt.Sprintf("driver=nbd,server.type=unix,server.path=%s,export=%s,x-dirty-bitmap=qemu:dirty-bitmap:%s", sock, export, bitmap)
	b, err := exec.CommandContext(ctx, "qemu-img", "map", "--output=json", "--image-opts", img).Output()
	if err != nil {
		t.Fatalf("qemu-img map: %v", err)
	}
	var ext []struct {
		Start, Length int64
		Data          bool
	}
	if err := json.Unmarshal(b, &ext); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ext {
		if e.Data {
			continue
		}
		for m := e.Start >> 20; m < (e.Start+e.Length+(1<<20)-1)>>20; m++ {
			out = append(out, fmt.Sprint(m))
		}
	}
	return out
}
