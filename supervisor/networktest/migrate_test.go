package networktest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/net/nics"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestMigrateLocalTaps: a guest with a Linux bridge NIC and an OVS NIC
// moves into a new QEMU on this host and back (migrate --local, which a
// tap NIC used to refuse). Each time the new QEMU runs on taps of its own
// on the same bridges, the old QEMU's taps and OVS port are gone, and the
// guest's network answers: the host pings it on both NICs, it pings the
// host; the host's pings during the move are counted. Down then leaves no
// tap or port.
func TestMigrateLocalTaps(t *testing.T) {
	ctx := ctxT(t, 6*time.Minute)
	sup := newSup(t)
	f := guestFile(t, "mvtap", "vmsup.ip=10.88.0.30/24", `
[[nic]]
name = "lan"
type = "bridge"
bridge = "`+linuxBridge+`"

[[nic]]
name = "sw"
type = "ovs"
bridge = "`+ovsBridge+`"
`)
	own := []string{f.VM.NICs[0].Tap, f.VM.NICs[1].Tap}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), "mvtap") })
	g := shell(t, ctx, sup, "mvtap")
	guestRun(t, ctx, g, "ip addr add 10.89.0.30/24 dev eth1 && ip link set eth1 up")
	answers := func(round int) {
		t.Helper()
		guestRun(t, ctx, g, "ping -c 1 -W 5 "+linuxHost+" && ping -c 1 -W 5 "+ovsHost)
		hostPing(t, ctx, "10.88.0.30")
		hostPing(t, ctx, "10.89.0.30")
	}
	answers(-1)

	taps := own
	for round, unit := range []string{"vmsup-mvtap@migrated.service", "vmsup-mvtap.service"} {
		lost, sent := pingDuring(ctx, "10.88.0.30")
		res, err := sup.Migrate(ctx, "mvtap", supervisor.MigrateOptions{Local: true})
		l := lost()
		n := *sent
		if err != nil {
			t.Fatal(err)
		}
		st, err := sup.Status(ctx, "mvtap")
		if err != nil || res.Unit != unit || st.Unit != unit || len(st.NICs) != 2 {
			t.Fatalf("round %d: migrate --local: %+v; status %+v %v", round, res, st, err)
		}
		t.Logf("round %d: %s in %s (downtime %s); host pings every 100 ms during it: %d of %d lost",
			round, unit, res.Wall.Round(time.Millisecond), res.Downtime, l, n)
		for i, nic := range st.NICs {
			// The taps take turns: another name, then the file's own again.
			if nic.Tap == taps[i] || (round == 1) != (nic.Tap == own[i]) || !nic.TapUp || nic.Bridge != []string{linuxBridge, ovsBridge}[i] {
				t.Errorf("round %d: nic %s: %+v (was on tap %s)", round, nic.Name, nic, taps[i])
			}
			if netsetup.LinkExists(taps[i]) {
				t.Errorf("round %d: the old QEMU's tap %s is left", round, taps[i])
			}
		}
		if ports := ovsPorts(t, ctx); !slices.Contains(ports, st.NICs[1].Tap) || slices.Contains(ports, taps[1]) {
			t.Errorf("round %d: OVS ports %v, want %s and not %s", round, ports, st.NICs[1].Tap, taps[1])
		}
		taps = []string{st.NICs[0].Tap, st.NICs[1].Tap}
		g.Close() // the old QEMU's console
		g = shell(t, ctx, sup, "mvtap")
		answers(round)
	}
	if _, err := sup.Down(ctx, "mvtap"); err != nil {
		t.Fatal(err)
	}
	if netsetup.LinkExists(own[0]) || netsetup.LinkExists(own[1]) || slices.Contains(ovsPorts(t, ctx), own[1]) {
		t.Fatalf("after down: taps %v there %v %v, OVS ports %v", own, netsetup.LinkExists(own[0]), netsetup.LinkExists(own[1]), ovsPorts(t, ctx))
	}
}

// pingDuring pings addr from the host every 100 ms until lost is called,
// which stops it and says how many of the sent got no answer within 1 s.
func pingDuring(ctx context.Context, addr string) (lost func() int, sent *int) {
	var n, missed atomic.Int64
	var count int
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			n.Add(1)
			if exec.CommandContext(ctx, "busybox", "ping", "-c", "1", "-W", "1", addr).Run() != nil {
				missed.Add(1)
			}
		}
	}()
	return func() int {
		close(stop)
		<-done
		count = int(n.Load())
		return int(missed.Load())
	}, &count
}

// TestMigrateLocalTapsKilled: migrate --local of a guest on a Linux
// bridge, its command killed after each of its steps (the source's, the
// new QEMU's start and hand-over, all in one process). The next local
// migration settles the kill and succeeds; then exactly one tap of the
// NIC is left, recorded as its tap with no next one, on the bridge, and
// the host pings the guest.
func TestMigrateLocalTapsKilled(t *testing.T) {
	ctx := ctxT(t, 25*time.Minute)
	sup := newSup(t)
	f := guestFile(t, "mvkill", "vmsup.ip=10.88.0.31/24", `
[[nic]]
name = "lan"
type = "bridge"
bridge = "`+linuxBridge+`"
`)
	own := f.VM.NICs[0].Tap
	names := []string{own, nics.NextTap(own, own)}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), "mvkill") })
	shell(t, ctx, sup, "mvkill").Close()
	hostPing(t, ctx, "10.88.0.31")
	job := supervisortest.FaultJob{Root: sup.Root(), Bus: env.Systemd.BusAddress, JournalDir: env.Systemd.JournalDir,
		QEMU: env.QEMU, Self: vmsupBin, HostCache: env.CapsCache, Op: "migrate-local", VM: "mvkill",
		Trace: filepath.Join(t.TempDir(), "trace")}
	if killed, out, _ := supervisortest.RunJob(t, ctx, job, 0); killed || out != "" {
		t.Fatalf("migrate --local: killed %v: %s", killed, out)
	}
	trace, _ := os.ReadFile(job.Trace)
	var steps []string
	for _, s := range strings.Split(strings.TrimSpace(string(trace)), "\n") {
		if !slices.Contains(steps, s) {
			steps = append(steps, s)
		}
	}
	job.Trace = ""
	for _, step := range steps {
		job.KillAfter = step
		if killed, out, _ := supervisortest.RunJob(t, ctx, job, 0); !killed {
			t.Fatalf("%s: not killed: %s", step, out)
		}
		// The next migration, once the kill's guardian let the VM go.
		var busy *supervisor.BusyError
		for _, err := sup.Migrate(ctx, "mvkill", supervisor.MigrateOptions{Local: true}); err != nil; _, err = sup.Migrate(ctx, "mvkill", supervisor.MigrateOptions{Local: true}) {
			if !errors.As(err, &busy) || ctx.Err() != nil {
				t.Fatalf("killed after %s: the next migration: %v", step, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		rec, err := nics.ReadRecord(vmstore.Store{Root: sup.Root()}.Paths("mvkill"))
		if err != nil || len(rec.NICs) != 1 {
			t.Fatalf("killed after %s: network record %+v %v", step, rec, err)
		}
		n := rec.NICs[0]
		there := slices.DeleteFunc(slices.Clone(names), func(s string) bool { return !netsetup.LinkExists(s) })
		if br, _ := netsetup.LinkMaster(n.Tap); n.Next != "" || !slices.Equal(there, []string{n.Tap}) || br != linuxBridge {
			t.Fatalf("killed after %s: record %+v, taps there %v, on %q", step, n, there, br)
		}
		hostPing(t, ctx, "10.88.0.31")
	}
	t.Logf("killed after each of %d steps: %s", len(steps), strings.Join(steps, ", "))
}
