package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/dev/bench"
	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

const secMigDisk = "11. move a VM with a 1 GiB local disk to another host (test guest, TCG, hosts in network namespaces)"

// The ways of the migrate-disk section: live, and offline with the disk
// copied over the network (NBD) or through the filesystem.
const (
	vMDLive    = "vmsup migrate --to (disk copied live)"
	vMDNBD     = "down, qemu-img convert to NBD on B, up there"
	vMDOffline = "down, qemu-img convert into B's directory, up there"
)

// The data disk: 1 GiB virtual, random data in every other MiB (512 MiB
// allocated, spread over the whole disk); the guest checks mdCheckMiB.
const (
	mdDiskMiB  = 1024
	mdCheckMiB = 256
	mdName     = "mdisk"
)

// mdFigures are one way's measurements; parts are its steps' times.
type mdFigures struct {
	unavail, total []float64
	parts          map[string][]float64
	fails          int
	downBy         map[string]int // how vmsup down ended the guest (offline)
}

func (m *mdFigures) part(name string, v float64) {
	if m.parts == nil {
		m.parts = map[string][]float64{}
	}
	m.parts[name] = append(m.parts[name], v)
}

// migrateDisk measures, on two hosts in network namespaces, moving a booted
// test guest (256 MiB, TCG) with a 1 GiB local qcow2 data disk holding
// 512 MiB of random data: `vmsup migrate --to` copying the disk while the
// guest runs, against what an operator does without it: stop the VM,
// qemu-img convert its disk to the other host, start it there. Each rep
// boots a fresh guest on A for each way (the order rotated); after each
// move the guest answers on its console on B and reads the disk's data
// back as it was.
func (f *fixture) migrateDisk(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	dir := filepath.Join(f.dir, "mdisk")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	step("migrate-disk: two hosts, a 1 GiB qcow2 with 512 MiB of data")
	hs, err := f.twoDiskHosts(ctx, dir)
	if err != nil {
		return err
	}
	defer hs.close()
	tmpl, sum, err := mdTemplate(ctx, dir)
	if err != nil {
		return err
	}
	disk := filepath.Join(hs.disks, "data.qcow2")
	vm, path, err := f.mdGuest(dir, disk)
	if err != nil {
		return err
	}
	reps := max(1, f.cfg.migDiskReps)
	figs := map[string]*mdFigures{vMDLive: {}, vMDNBD: {}, vMDOffline: {}}
	all := []string{vMDLive, vMDNBD, vMDOffline}
	for i := range reps {
		for j := range all {
			w := all[(i+j)%len(all)]
			step(fmt.Sprintf("migrate-disk: rep %d/%d, %s", i+1, reps, w))
			if err := f.mdOnce(ctx, hs, w, vm, path, tmpl, disk, sum, figs[w]); err != nil {
				return fmt.Errorf("%s: %w", w, err)
			}
		}
	}
	f.addMigDiskRows(reps, figs)
	return nil
}

// mdOnce boots the guest on A on a fresh copy of the template, moves it
// to B one way (timed), checks it there and removes it.
func (f *fixture) mdOnce(ctx context.Context, hs *diskHosts, way string, vm *spec.File, path, tmpl, disk, sum string, fg *mdFigures) error {
	a, b := hs.a, hs.b
	defer func() {
		dctx := context.WithoutCancel(ctx)
		for _, h := range []*diskHost{a, b} {
			h.sup.Down(dctx, mdName)
			h.sup.Remove(dctx, mdName)
		}
		os.Remove(disk)
		os.Remove(b.view(disk))
	}()
	if err := runArgv(ctx, "cp", tmpl, disk); err != nil {
		return err
	}
	if _, err := a.sup.Up(ctx, vm); err != nil {
		return err
	}
	if err := consoleAnswers(ctx, a.sup, mdName, true); err != nil {
		return err
	}
	var err error
	switch way {
	case vMDLive:
		err = mdLive(ctx, a, b, fg)
	case vMDNBD:
		err = mdOffline(ctx, a, b, path, disk, fg, func() error { return mdCopyNBD(ctx, a, b, disk) })
	default:
		err = mdOffline(ctx, a, b, path, disk, fg, func() error {
			return runArgv(ctx, "qemu-img", "convert", "-f", "qcow2", "-O", "qcow2", disk, b.view(disk))
		})
	}
	if err != nil {
		return err
	}
	if _, err := os.Stat(disk); !os.IsNotExist(err) {
		return fmt.Errorf("host A: the disk's image is still there after the move (%v)", err)
	}
	return mdCheckData(ctx, b.sup, sum)
}

// mdLive: `vmsup migrate --to B` (the Go API's Migrate, as the CLI runs
// it). The guest was unavailable from the source QEMU's STOP event to the
// destination QEMU's RESUME (both QEMUs' clocks are this machine's; the
// result's Pause is only filled for one host, so read from the events).
func mdLive(ctx context.Context, a, b *diskHost, fg *mdFigures) error {
	stopped := watchStop(ctx, a.sup, mdName)
	t0 := time.Now()
	res, err := a.sup.Migrate(ctx, mdName, supervisor.MigrateOptions{To: "B", Address: b.addr, Transport: b.transport(), Dial: a.dial})
	if err != nil {
		return err
	}
	wall := time.Since(t0)
	if res.Disks != 1 || res.DiskTransferred < (mdDiskMiB/4)<<20 {
		return fmt.Errorf("copied %d disks, %d bytes: want 1 with its 512 MiB of data", res.Disks, res.DiskTransferred)
	}
	fg.total = append(fg.total, ms(wall))
	fg.part("disk in sync", ms(res.DiskTime))
	fg.part("QEMU downtime", ms(res.Downtime))
	fg.part("disk MiB sent", float64(res.DiskTransferred)/(1<<20))
	stop := stopped()
	resume, err := firstEvent(ctx, b.sup, mdName, "RESUME", t0)
	if err != nil || stop.IsZero() || !resume.After(stop) {
		fg.fails++
		fmt.Fprintf(os.Stderr, "vmsup-bench: migrate-disk: no pause: STOP %v, RESUME %v (%v)\n", stop, resume, err)
		return nil
	}
	fg.unavail = append(fg.unavail, ms(resume.Sub(stop)))
	return nil
}

// mdOffline: what an operator does without storage migration: vmsup down
// on A, the disk copied to B (copyDisk), vmsup up on B (its CLI, in B's
// namespaces), until the guest answers on its console there (the guest
// unavailable from the down on), then vmsup rm and the image removed on A
// (the whole move).
func mdOffline(ctx context.Context, a, b *diskHost, path, disk string, fg *mdFigures, copyDisk func() error) error {
	t0 := time.Now()
	down, err := a.sup.Down(ctx, mdName)
	if err != nil {
		return err
	}
	if fg.downBy == nil {
		fg.downBy = map[string]int{}
	}
	fg.downBy[string(down.Step)]++
	t1 := time.Now()
	if err := copyDisk(); err != nil {
		return err
	}
	t2 := time.Now()
	if out, err := b.cli(ctx, "up", path).CombinedOutput(); err != nil {
		return fmt.Errorf("host B: vmsup up: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := consoleAnswers(ctx, b.sup, mdName, true); err != nil {
		return fmt.Errorf("host B: %w", err)
	}
	t3 := time.Now()
	if err := a.sup.Remove(ctx, mdName); err != nil {
		return err
	}
	if err := os.Remove(disk); err != nil {
		return err
	}
	fg.unavail, fg.total = append(fg.unavail, ms(t3.Sub(t0))), append(fg.total, ms(time.Since(t0)))
	fg.part("down", ms(t1.Sub(t0)))
	fg.part("copy", ms(t2.Sub(t1)))
	fg.part("up to console answer", ms(t3.Sub(t2)))
	return nil
}

// mdCopyNBD copies the disk as between hosts with no shared storage:
// qemu-img create on B, qemu-nbd serving it on B's address (one client,
// then it exits, the image flushed and unlocked), qemu-img convert from A
// into it over the veth.
func mdCopyNBD(ctx context.Context, a, b *diskHost, disk string) error {
	if err := runArgv(ctx, append(b.enter(), "qemu-img", "create", "-q", "-f", "qcow2", disk, fmt.Sprintf("%dM", mdDiskMiB))...); err != nil {
		return err
	}
	port := 20000 + rand.IntN(40000)
	var serr strings.Builder
	// nsenter without -p execs qemu-nbd: this process's child, its pid ours.
	srv := exec.CommandContext(ctx, "nsenter", "--net="+b.netns, "-t", fmt.Sprint(b.sd.PID1), "-m", "--",
		"qemu-nbd", "-f", "qcow2", "-b", b.addr, "-p", fmt.Sprint(port), disk)
	srv.Stdout, srv.Stderr = &serr, &serr
	if err := srv.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	fail := func(err error) error {
		srv.Process.Kill()
		<-exited
		return fmt.Errorf("%w (qemu-nbd: %s)", err, strings.TrimSpace(serr.String()))
	}
	// Listening: its socket in its namespace's table (a probe connection
	// would be its one client).
	listen := fmt.Sprintf(":%04X 00000000:0000 0A", port)
	if err := waitFor(ctx, 10*time.Second, func() bool {
		t, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", srv.Process.Pid))
		return strings.Contains(string(t), listen)
	}); err != nil {
		return fail(fmt.Errorf("qemu-nbd on %s:%d: not listening: %w", b.addr, port, err))
	}
	if err := runArgv(ctx, "nsenter", "--net="+a.netns, "qemu-img", "convert", "-n", "-f", "qcow2", "-O", "raw", disk,
		fmt.Sprintf("nbd://%s:%d", b.addr, port)); err != nil {
		return fail(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			return fmt.Errorf("qemu-nbd: %v: %s", err, strings.TrimSpace(serr.String()))
		}
		return nil
	case <-time.After(30 * time.Second):
		return fail(fmt.Errorf("qemu-nbd still serving 30 s after its client left"))
	}
}

// watchStop follows the VM's events from now on; the returned func waits
// (a few seconds at most) for the QEMU's end and gives the time of its last
// STOP event (zero if none was seen).
func watchStop(ctx context.Context, sup *supervisor.Supervisor, name string) func() time.Time {
	wctx, cancel := context.WithCancel(ctx)
	ch, err := sup.EventsSince(wctx, name, time.Now())
	done := make(chan time.Time, 1)
	go func() {
		var last time.Time
		for err == nil {
			ev, ok := <-ch
			if !ok {
				break
			}
			if ev.Kind == "STOP" {
				last = ev.Time
			}
		}
		done <- last
	}()
	return func() time.Time {
		defer cancel()
		select {
		case t := <-done:
			return t
		case <-time.After(10 * time.Second):
			cancel()
			return <-done
		}
	}
}

// firstEvent is the time of the VM's first kind event since.
func firstEvent(ctx context.Context, sup *supervisor.Supervisor, name, kind string, since time.Time) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ch, err := sup.EventsSince(ctx, name, since)
	if err != nil {
		return time.Time{}, err
	}
	for ev := range ch {
		if ev.Kind == kind {
			return ev.Time, nil
		}
	}
	return time.Time{}, fmt.Errorf("no %s event", kind)
}

// mdCheckData: the guest on B answers and reads the MiB at mdCheckMiB of
// its data disk as the template had it (its page cache dropped).
func mdCheckData(ctx context.Context, sup *supervisor.Supervisor, sum string) error {
	if err := consoleAnswers(ctx, sup, mdName, false); err != nil {
		return fmt.Errorf("host B: %w", err)
	}
	st, err := sup.Status(ctx, mdName)
	if err != nil {
		return err
	}
	sh, err := testenv.DialConsole(ctx, st.Console)
	if err != nil {
		return err
	}
	defer sh.Close()
	out, _, err := sh.Run(ctx, fmt.Sprintf("echo 3 >/proc/sys/vm/drop_caches; dd if=/dev/vda bs=1M skip=%d count=1 2>/dev/null | sha256sum", mdCheckMiB))
	if err != nil {
		return err
	}
	if !strings.Contains(out, sum) {
		return fmt.Errorf("host B: the data disk's MiB %d reads %q, want sha256 %s", mdCheckMiB, strings.TrimSpace(out), sum)
	}
	return nil
}

// mdTemplate writes dir/data-template.qcow2: 1 GiB virtual, random data in
// every other MiB, and returns it and the sha256 of MiB mdCheckMiB.
func mdTemplate(ctx context.Context, dir string) (path, sum string, err error) {
	raw := filepath.Join(dir, "data-template.raw")
	fh, err := os.Create(raw)
	if err != nil {
		return "", "", err
	}
	defer os.Remove(raw)
	rng := rand.NewChaCha8([32]byte{'v', 'm', 's', 'u', 'p'})
	buf := make([]byte, 1<<20)
	for i := 0; i < mdDiskMiB; i += 2 {
		rng.Read(buf)
		if i == mdCheckMiB {
			s := sha256.Sum256(buf)
			sum = hex.EncodeToString(s[:])
		}
		if _, err := fh.WriteAt(buf, int64(i)<<20); err != nil {
			fh.Close()
			return "", "", err
		}
	}
	if err := fh.Truncate(mdDiskMiB << 20); err != nil {
		fh.Close()
		return "", "", err
	}
	if err := fh.Close(); err != nil {
		return "", "", err
	}
	path = filepath.Join(dir, "data-template.qcow2")
	if out, err := exec.CommandContext(ctx, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, path).CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("qemu-img convert: %v: %s", err, out)
	}
	return path, sum, nil
}

// mdGuest is the counter test guest, 256 MiB of private memory, with the
// data disk at disk; its file is written to dir, where both hosts see it.
func (f *fixture) mdGuest(dir, disk string) (*spec.File, string, error) {
	body := fmt.Sprintf(`name = %q
memory = "256M"
accel = "tcg"
stop_timeout = "10s"
shared_memory = false

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check vmsup.counter"

[[disk]]
name = "data"
file = %q
format = "qcow2"
size = "1G"
`, mdName, f.guest.kernel, f.guest.initrd, disk)
	path := filepath.Join(dir, mdName+".toml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		return nil, "", err
	}
	vm, err := spec.Load(path)
	return vm, path, err
}

// addMigDiskRows adds both ways' rows, the live copy against the offline
// move, and the steps' medians in the notes.
func (f *fixture) addMigDiskRows(reps int, figs map[string]*mdFigures) {
	parts := func(fg *mdFigures, names ...string) string {
		var s []string
		for _, n := range names {
			med := bench.Summarize(fg.parts[n]).Median
			if n == "disk MiB sent" {
				s = append(s, fmt.Sprintf("%.0f MiB sent", med))
			} else {
				s = append(s, fmt.Sprintf("%s %.0f ms", n, med))
			}
		}
		return "medians: " + strings.Join(s, ", ")
	}
	live := figs[vMDLive]
	f.report.Add(bench.Row{Section: secMigDisk, Figure: "guest unavailable", Variant: vMDLive, Accel: "tcg", Unit: "ms",
		Summary: bench.Summarize(live.unavail), Baseline: vMDNBD, Failures: live.fails,
		Note: "source STOP to destination RESUME (QEMU's events); " + parts(live, "QEMU downtime")})
	for _, w := range []string{vMDNBD, vMDOffline} {
		off := figs[w]
		f.report.Add(bench.Row{Section: secMigDisk, Figure: "guest unavailable", Variant: w, Accel: "tcg", Unit: "ms",
			Summary: bench.Summarize(off.unavail), Failures: reps - len(off.unavail),
			Note: fmt.Sprintf("vmsup down on A to the guest answering on B's console; %s; down by %v", parts(off, "down", "copy", "up to console answer"), off.downBy)})
	}
	f.report.Add(bench.Row{Section: secMigDisk, Figure: "whole move", Variant: vMDLive, Accel: "tcg", Unit: "ms",
		Summary: bench.Summarize(live.total), Baseline: vMDNBD, Note: "the whole migrate; " + parts(live, "disk in sync", "disk MiB sent")})
	for _, w := range []string{vMDNBD, vMDOffline} {
		f.report.Add(bench.Row{Section: secMigDisk, Figure: "whole move", Variant: w, Accel: "tcg", Unit: "ms",
			Summary: bench.Summarize(figs[w].total), Note: "then vmsup rm and the image removed on A"})
	}
	f.report.Note("11. migrate-disk: hosts A and B are two systemd sandboxes with network namespaces joined by a veth pair (addresses picked per run), the disk directory each host's own (B binds another directory over it in its mount namespace; both on this machine's disk); the test guest (256 MiB private memory, 1 vCPU, TCG, idle: a counter on its console) with a 1 GiB qcow2 data disk holding 512 MiB of random data (every other MiB), a fresh copy booted on A for each move, the ways rotating which goes first. Live: default bandwidth (RAM at QEMU's 128 MiB/s, the disk copy unbounded) through vmsup's relay with TLS; the mirror (sync full) counts the unallocated half as sent (NBD write-zeroes, nothing on the wire); the RAM copy is a stop-and-copy under TCG, so the pause is the RAM copy plus vmsup's finalize. Offline: vmsup down (ACPI), then the copy: over the network, qemu-img create on B, qemu-nbd serving it on B's address, qemu-img convert -n from A into nbd://B (plaintext, no TLS); or qemu-img convert -O qcow2 straight into B's directory through its mount namespace (no network: a lower bound); then vmsup up by B's CLI until the guest answers on its console. After each move the guest on B answered on its console and read back a MiB of its disk as written.")
}
