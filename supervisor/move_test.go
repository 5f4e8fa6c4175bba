package supervisor_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/imagestore"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestMoveShutOff: vmsup move between two hosts whose disk directory is
// each one's own (supervisortest.LocalDisks). A guest with a local qcow2
// data disk writes synced markers; moving it while it runs is refused.
// Shut off, it moves A -> B (in this process): B defines it, shut off, with
// the disk's image, A knows nothing of it; started on B (B's CLI) it reads
// every marker back and writes a token; shut off again it moves back
// B -> A (B's CLI), and A's image holds the markers and the token. Then
// kills, with no guest running: the CLI after its journal's steps and the
// receiver after its own, each settled by the guardians alone to one
// defined copy with its disk, on the side the step decides.
func TestMoveShutOff(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	a, b := twoHosts(t)
	dir := t.TempDir()
	ddir := filepath.Join(dir, "disks")
	supervisortest.LocalDisks(t, a, b, ddir)
	const name = "mvo"
	disk := filepath.Join(ddir, "data.qcow2")
	f := supervisortest.LocalDiskGuest(t, env, dir, name, disk, "")
	t.Cleanup(func() {
		for _, h := range []*supervisortest.Host{a, b} {
			h.Sup.Down(context.Background(), name)
			h.CLI(context.Background(), "rm", name).Run()
		}
	})
	if _, err := a.Sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	stA, _ := a.Sup.Status(ctx, name)
	waitConsole(t, stA, "VMSUP-SHELL-READY", 90*time.Second)
	supervisortest.StartMarkWriter(t, ctx, stA.Console)
	time.Sleep(time.Second)
	toB := supervisor.MigrateOptions{To: "B", Address: b.Addr, Transport: b.Transport(""), Dial: a.Dial}
	if _, err := a.Sup.Move(ctx, name, toB); err == nil || !strings.Contains(err.Error(), "vmsup migrate "+name) {
		t.Fatalf("move of a running VM: want refused, pointing at vmsup migrate, got %v", err)
	} else {
		t.Logf("running: %v", err)
	}
	n := supervisortest.StopMarkWriter(t, ctx, stA.Console)
	if _, err := a.Sup.Down(ctx, name); err != nil {
		t.Fatal(err)
	}

	t0 := time.Now()
	res, err := a.Sup.Move(ctx, name, toB)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("A -> B in %s: %d disk(s), %d bytes in %s", time.Since(t0).Round(time.Millisecond), res.Disks, res.DiskTransferred, res.DiskTime.Round(time.Millisecond))
	if res.Disks != 1 || res.DiskTransferred <= 0 {
		t.Errorf("disks copied %d, %d bytes: want 1 disk, its data", res.Disks, res.DiskTransferred)
	}
	if on := supervisortest.SettleShutOff(t, ctx, name, disk, a, b); on != b {
		t.Fatalf("after the move the VM is defined on %s", on.Name)
	}
	if out, err := b.CLI(ctx, "up", f.Path).CombinedOutput(); err != nil {
		t.Fatalf("B: up: %v\n%s", err, out)
	}
	stB, _ := b.Sup.Status(ctx, name)
	waitConsole(t, stB, "VMSUP-SHELL-READY", 90*time.Second)
	supervisortest.CheckMarks(t, ctx, stB.Console, n)
	t.Logf("B: all %d markers read back", n)
	const token = "vmsup-moved-on-B"
	supervisortest.WriteGuestData(t, ctx, stB.Console, token)
	if out, err := b.CLI(ctx, "down", name).CombinedOutput(); err != nil {
		t.Fatalf("B: down: %v\n%s", err, out)
	}
	toA := a.Broker(t)
	t0 = time.Now()
	out, err := b.CLI(ctx, "move", name, "--to", "A", "--address", a.Addr, "--transport", strings.Join(toA, " ")).CombinedOutput()
	if err != nil {
		t.Fatalf("move back: %v\n%s", err, out)
	}
	t.Logf("B -> A in %s: %s", time.Since(t0).Round(time.Millisecond), lastLine(string(out)))
	if on := supervisortest.SettleShutOff(t, ctx, name, disk, a, b); on != a {
		t.Fatalf("after the move back the VM is defined on %s", on.Name)
	}
	checkMovedImage(t, ctx, a, disk, n, token)

	if !t.Run("kills", func(t *testing.T) { moveKills(t, ctx, a, b, name, disk, n, token) }) {
		return
	}
	t.Run("image-pulled", func(t *testing.T) { moveImagePulled(t, ctx, a, b, dir, ddir) })
}

// moveImagePulled: a shut-off VM whose disk is an overlay on a stored
// image that B's store lacks moves to B: B pulls the image by digest from
// where A's store got it (an HTTP server in A's network namespace), and
// only the overlay's top layer is copied; the base's data reads back
// under it on B.
func moveImagePulled(t *testing.T, ctx context.Context, a, b *supervisortest.Host, dir, ddir string) {
	data := make([]byte, 32<<20)
	rand.Read(data)
	os.WriteFile(filepath.Join(dir, "base.raw"), data, 0o644)
	ln := listenIn(t, a.Netns, a.Addr)
	srv := &http.Server{Handler: http.FileServer(http.Dir(dir))}
	go srv.Serve(ln)
	defer srv.Close()
	sum := sha256.Sum256(data)
	im, err := imagestore.Store{Dir: imagestore.Dir(a.Root)}.Pull(ctx, imagestore.Pull{Source: "http://" + ln.Addr().String() + "/base.raw",
		SHA256: hex.EncodeToString(sum[:]), Client: &http.Client{Transport: &http.Transport{DialContext: a.Dial}}})
	if err != nil {
		t.Fatal(err)
	}
	const name = "mvi"
	disk := filepath.Join(ddir, "top.qcow2")
	f := supervisortest.LocalDiskGuest(t, env, dir, name, disk, `image = "`+im.Digest+`"`)
	t.Cleanup(func() {
		for _, h := range []*supervisortest.Host{a, b} {
			h.Sup.Down(context.Background(), name)
			h.CLI(context.Background(), "rm", name).Run()
		}
	})
	// One start makes the overlay and the record; the move needs no guest.
	if _, err := a.Sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Sup.Kill(ctx, name); err != nil {
		t.Fatal(err)
	}
	// The top layer's own data: 64 KiB at 1 MiB.
	runCmd(t, "qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 1M 64k", disk)
	copy(data[1<<20:1<<20+64<<10], bytes.Repeat([]byte{0x5a}, 64<<10))
	res, err := a.Sup.Move(ctx, name, supervisor.MigrateOptions{To: "B", Address: b.Addr, Transport: b.Transport(""), Dial: a.Dial})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("A -> B: %d disk(s), %d bytes copied of an overlay on a 32 MiB base B pulled by digest", res.Disks, res.DiskTransferred)
	if res.Disks != 1 || res.DiskTransferred < 64<<10 || res.DiskTransferred > 8<<20 {
		t.Errorf("disks copied %d, %d bytes: want 1 disk, its top layer only (< 8 MiB of the base's 32)", res.Disks, res.DiskTransferred)
	}
	if got, err := (imagestore.Store{Dir: imagestore.Dir(b.Root)}).Resolve(im.Digest); err != nil || got.Source != im.Source {
		t.Fatalf("B's store: %+v %v, want the image pulled from %s", got, err, im.Source)
	}
	if on := supervisortest.SettleShutOff(t, ctx, name, disk, a, b); on != b {
		t.Fatalf("the VM is defined on %s", on.Name)
	}
	raw := filepath.Join(t.TempDir(), "top.raw")
	cmd := exec.CommandContext(ctx, "nsenter", "-t", fmt.Sprint(b.SD.PID1), "-m", "qemu-img", "dd", "-f", "qcow2", "-O", "raw",
		"if="+disk, "of="+raw, "bs=1M", "count=32")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("B: read %s: %v\n%s", disk, err, out)
	}
	if got, _ := os.ReadFile(raw); !bytes.Equal(got, data) {
		t.Fatal("B: the disk's data (the base's under the top layer's) differs")
	}
}

// listenIn listens on addr:0 in the network namespace at nsPath (a locked
// thread moved there, discarded after).
func listenIn(t *testing.T, nsPath, addr string) net.Listener {
	t.Helper()
	ch := make(chan any, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := os.Open(nsPath)
		if err == nil {
			err = unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET)
			ns.Close()
		}
		if err != nil {
			ch <- err
			return
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
		if err != nil {
			ch <- err
			return
		}
		ch <- ln
	}()
	switch v := (<-ch).(type) {
	case net.Listener:
		t.Cleanup(func() { v.Close() })
		return v
	case error:
		t.Fatal(v)
	}
	return nil
}

// checkMovedImage reads disk as h sees it: token at its start, then the
// markers 1..n, each in sector i+8 (supervisortest.StartMarkWriter).
func checkMovedImage(t *testing.T, ctx context.Context, h *supervisortest.Host, disk string, n int, token string) {
	t.Helper()
	raw := filepath.Join(t.TempDir(), "disk.raw")
	cmd := exec.CommandContext(ctx, "nsenter", "-t", fmt.Sprint(h.SD.PID1), "-m", "qemu-img", "dd", "-f", "qcow2", "-O", "raw",
		"if="+disk, "of="+raw, "bs=512", fmt.Sprint("count=", n+16))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: read %s: %v\n%s", h.Name, disk, err, out)
	}
	b, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte(token)) {
		t.Fatalf("%s: %s starts with %q, want %q", h.Name, disk, b[:len(token)], token)
	}
	for i := 1; i <= n; i++ {
		off := (i + 8) * 512
		if want := fmt.Sprintf("MARK%08d", i); len(b) < off+len(want) || string(b[off:off+len(want)]) != want {
			t.Fatalf("%s: marker %d of %d not in %s", h.Name, i, n, disk)
		}
	}
}

// moveKills kills the CLI moving the VM A -> B during the disk's copy
// (throttled) and after some of its steps, and B's receiver after each of
// its own; the guardians alone settle each
// to one defined copy, on B once the step says the destination defined it,
// else on A; the image's data is intact wherever it ends.
func moveKills(t *testing.T, ctx context.Context, a, b *supervisortest.Host, name, disk string, n int, token string) {
	sa := supervisortest.NewSide(t, env, vmsupBin, "A", a.SD, a.Root, a.UnitDir(), a.Sup)
	sb := supervisortest.NewSide(t, env, vmsupBin, "B", b.SD, b.Root, b.UnitDir(), b.Sup)
	// Each side's guardian reaches the other's receiver through a broker
	// (a sandbox has its own /proc); the next receiver on B may be one
	// under fault.
	var mu sync.Mutex
	var nextB []string
	toA := a.Broker(t)
	toB := b.BrokerFor(t, func() []string {
		mu.Lock()
		defer mu.Unlock()
		if next := nextB; next != nil {
			nextB = nil
			return next
		}
		return b.Transport("")
	})
	back := func(on *supervisortest.Host) {
		if on == a {
			return
		}
		out, err := b.CLI(ctx, "move", name, "--to", "A", "--address", a.Addr, "--transport", strings.Join(toA, " ")).CombinedOutput()
		if err != nil {
			t.Fatalf("move back: %v\n%s", err, out)
		}
	}
	// 16 MiB of data (zeros cost nothing): at 8 MiB/s the copy lasts ~2 s,
	// and a kill at 1 s lands in it.
	runCmd(t, "qemu-io", "-f", "qcow2", "-c", "write -P 0x33 8M 16M", disk)
	for _, k := range []struct{ who, step, want string }{
		{"cli", "", "A"}, // at 1 s, while the disk is copied
		{"cli", "migrate-disks-ready", "A"},
		{"cli", "move-finalize-sent", "A"},
		{"cli", "move-finalized", "B"},
		{"receiver", supervisor.StepCopies, "A"},
		{"receiver", "move-defined", "B"},
	} {
		t0 := time.Now()
		if k.who == "cli" {
			j := sa.Job
			j.Op, j.VM, j.To, j.Address, j.Transport, j.DialNetns, j.KillAfter = "move", name, "B", b.Addr, toB, a.Netns, k.step
			killAt := time.Duration(0)
			if k.step == "" {
				j.Bandwidth, j.Trace, killAt = 8<<20, filepath.Join(t.TempDir(), "trace"), time.Second
			}
			if killed, out, _ := supervisortest.RunJob(t, ctx, j, killAt); !killed {
				t.Fatalf("the CLI was not killed after %q: %s", k.step, out)
			}
			if j.Trace != "" {
				steps, _ := os.ReadFile(j.Trace)
				if f := strings.Fields(string(steps)); len(f) == 0 || f[len(f)-1] != "migrate-disks-mirroring" {
					t.Fatalf("the CLI was killed after its steps %q, want during the copy", f)
				}
			}
		} else {
			j := sb.Job
			j.VM, j.KillAfter = name, k.step
			mu.Lock()
			nextB = b.ReceiverTransportOf(j)
			mu.Unlock()
			o := supervisor.MigrateOptions{To: "B", Address: b.Addr, Transport: toB, Dial: a.Dial}
			if _, err := a.Sup.Move(ctx, name, o); err == nil {
				t.Fatalf("the receiver was not killed after %q", k.step)
			}
		}
		what := fmt.Sprintf("%s killed after %q", k.who, k.step)
		if k.step == "" {
			what = k.who + " killed at 1 s, during the copy"
		}
		on := supervisortest.SettleShutOff(t, ctx, name, disk, a, b)
		t.Logf("%s: settled in %s, defined on %s", what, time.Since(t0).Round(time.Millisecond), on.Name)
		if on.Name != k.want {
			t.Fatalf("%s: the VM is on %s, want %s", what, on.Name, k.want)
		}
		checkMovedImage(t, ctx, on, disk, n, token)
		back(on)
	}
}
