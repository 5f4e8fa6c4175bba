package fleettest_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/fleet/fleettest"
	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// localDisks: a fleet without shared storage, each host's disk directory
// its own (fleettest.Host.LocalDir). A running VM with a local qcow2 data
// disk, an overlay on a stored image of 16 MiB, a writer in the guest
// syncing markers to it, is drained off its host: the target's agent pulls
// the image by digest, then the drain's migration copies the disk's top
// layer while the guest runs; on the target every synced marker reads back
// from the copy, the base's data under it too, and the source keeps no
// image. A VM shut off on a local disk on the same host (cold) is moved
// with its disk (vmsup move) to the target, which runs it there on its
// own copy; the source keeps none.
func localDisks(t *testing.T, f *fleettest.Fleet, dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	disks := filepath.Join(dir, "local")
	for _, h := range f.Hosts {
		undo, err := h.LocalDir(disks, "256m")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(undo)
	}
	diskOf := func(vm string) string { return filepath.Join(disks, vm+".qcow2") }
	diskTOML := func(vm, extra string) string {
		return fmt.Sprintf("[[disk]]\nname = \"data\"\nfile = %q\nformat = \"qcow2\"\nsize = \"64M\"\n%s", diskOf(vm), extra)
	}
	base, cli := localBase(t, f, dir)
	// cold boots a kernel copy the test removes once it runs: killed, it
	// stays shut off (its agent cannot start it again) for the drain.
	kernel := filepath.Join(dir, "cold-vmlinuz")
	k, err := os.ReadFile(env.Guest.Kernel)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kernel, k, 0o644); err != nil {
		t.Fatal(err)
	}
	live := quietGuest(t, dir, "ld", "128M", diskTOML("ld", "image = \"ldbase\"\n"))
	cold := quietGuest(t, dir, "cold", "128M", diskTOML("cold", ""))
	b, _ := os.ReadFile(cold)
	if err := os.WriteFile(cold, []byte(strings.Replace(string(b), env.Guest.Kernel, kernel, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := f.VMSUPEnv(cli, "fleet", "apply", live, cold); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	vms := waitLs(t, f, 2*time.Minute, "ld and cold running", func(m map[string]fleettest.VM) bool {
		return m["ld"].State == "running" && m["cold"].State == "running"
	})
	h := f.Host(vms["ld"].Host)
	if vms["cold"].Host != h.Name {
		t.Fatalf("ld on %s, cold on %s: want both on the emptiest host", h.Name, vms["cold"].Host)
	}
	if err := os.Remove(kernel); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Sup.Kill(ctx, "cold"); err != nil {
		t.Fatal(err)
	}
	sock := h.Sup.ConsoleSocket("ld")
	st, err := h.Sup.Status(ctx, "ld")
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitLog(t, st.ConsoleLog, "VMSUP-SHELL-READY", 2*time.Minute)
	supervisortest.StartMarkWriter(t, ctx, sock)
	time.Sleep(time.Second)

	t0 := time.Now()
	// The CLI gives up at once; the drain goes on.
	f.VMSUP("fleet", "drain", h.Name, "--timeout", "1s")
	vms = waitLs(t, f, 3*time.Minute, "ld running elsewhere, cold moved", func(m map[string]fleettest.VM) bool {
		return m["ld"].State == "running" && m["ld"].Host != h.Name && m["cold"].Host != "" && m["cold"].Host != h.Name
	})
	to := f.Host(vms["ld"].Host)
	t.Logf("FLEET drain of a VM with a local qcow2 disk: %s -> %s in %s; cold: %+v", h.Name, to.Name, time.Since(t0).Round(time.Millisecond), vms["cold"])
	checkMoved(t, ctx, h, to, base, diskOf("ld"))
	// cold's kernel back (its agent could not restart it on h without it):
	// the target's agent starts it there, on the disk the move copied.
	if err := os.WriteFile(kernel, k, 0o644); err != nil {
		t.Fatal(err)
	}
	checkColdMoved(t, f, h, f.Host(vms["cold"].Host), diskOf("cold"))
	if _, err := f.VMSUP("fleet", "uncordon", h.Name); err != nil { // for the subtests after
		t.Fatal(err)
	}
	for _, vm := range []string{"ld", "cold"} {
		if _, err := f.VMSUP("fleet", "rm", vm); err != nil {
			t.Fatal(err)
		}
	}
	waitLs(t, f, time.Minute, "ld and cold removed", func(m map[string]fleettest.VM) bool {
		_, a := m["ld"]
		_, b := m["cold"]
		return !a && !b
	})
}

// checkColdMoved: cold, moved shut off from h to to with its disk, runs
// on to (its agent starts it from its spec), its disk there and nowhere
// else.
func checkColdMoved(t *testing.T, f *fleettest.Fleet, h, to *fleettest.Host, disk string) {
	t.Helper()
	waitLs(t, f, 3*time.Minute, "cold running on "+to.Name, func(m map[string]fleettest.VM) bool {
		return m["cold"].State == "running" && m["cold"].Host == to.Name
	})
	if to.QEMUPID("cold") == 0 || h.QEMUPID("cold") != 0 {
		t.Errorf("cold's QEMU on %s: %d (want one), on %s: %d (want none)", to.Name, to.QEMUPID("cold"), h.Name, h.QEMUPID("cold"))
	}
	for _, o := range f.Hosts {
		if o.HasFile(disk) != (o == to) {
			t.Errorf("cold's image on %s: %v; want it only on %s", o.Name, o.HasFile(disk), to.Name)
		}
	}
	if !strings.Contains(h.AgentLog(), "drain: moved") {
		t.Errorf("%s's agent does not say it moved cold", h.Name)
	}
}

// checkMoved: ld runs on to, every marker the guest synced on h and the
// base image's data under its overlay read back there, its disk was
// copied by its top layer after to pulled the image, h keeps nothing.
func checkMoved(t *testing.T, ctx context.Context, h, to *fleettest.Host, base []byte, disk string) {
	t.Helper()
	sockTo := to.Sup.ConsoleSocket("ld")
	synced := supervisortest.StopMarkWriter(t, ctx, sockTo)
	supervisortest.CheckMarks(t, ctx, sockTo, synced)
	t.Logf("%s: all %d markers the guest synced on %s are on %s's copy", "ld", synced, h.Name, to.Name)
	// The base's data under the overlay, from the target's copy of the image.
	sum := sha256.Sum256(base[8<<20 : 8<<20+64<<10])
	if out := supervisortest.GuestExec(t, ctx, sockTo, "dd if=/dev/vda bs=64k skip=128 count=1 2>/dev/null | sha256sum"); !strings.Contains(out, hex.EncodeToString(sum[:])) {
		t.Errorf("the base image's data under ld's overlay on %s: %q, want %x", to.Name, out, sum)
	}
	m := regexp.MustCompile(`drain: migrated"? vm=ld .*disks=(\d+) disk_bytes=(\d+)`).FindStringSubmatch(h.AgentLog())
	if m == nil || m[1] != "1" || len(m[2]) > 7 || !strings.Contains(to.AgentLog(), "pulling image") {
		t.Errorf("%s's agent: %q; want 1 disk copied, its top layer only (< 10 MB of the base's 16 MiB), after %s pulled the image", h.Name, m, to.Name)
	} else {
		t.Logf("%s's agent: ld migrated with %s disk, %s bytes copied (the base: %d)", h.Name, m[1], m[2], len(base))
	}
	if !to.HasFile(disk) || h.HasFile(disk) || h.QEMUPID("ld") != 0 {
		t.Errorf("ld's image on %s: %v (want it), on %s: %v (want none); QEMU left on %s: %d",
			to.Name, to.HasFile(disk), h.Name, h.HasFile(disk), h.Name, h.QEMUPID("ld"))
	}
}

// localBase is a 16 MiB raw image of random data served on the fleet's
// LAN, pulled as "ldbase" into the store of a CLI root of its own (the
// returned environment): fleet apply records its digest and source.
func localBase(t *testing.T, f *fleettest.Fleet, dir string) ([]byte, []string) {
	t.Helper()
	data := make([]byte, 16<<20)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(dir, "ldbase.raw"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(f.LAN.Addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(dir))}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	sum := sha256.Sum256(data)
	cli := append(append([]string{}, f.Env...), "VMSUP_ROOT="+filepath.Join(dir, "cli-root-ld"))
	url := "http://" + l.Addr().String() + "/ldbase.raw"
	if out, err := f.VMSUPEnv(cli, "image", "pull", url, "--sha256", hex.EncodeToString(sum[:]), "--name", "ldbase"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return data, cli
}
