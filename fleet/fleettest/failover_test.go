package fleettest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmsup/vmsup/fleet/fleettest"
	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// drain: fleet drain h2 moves its two VMs live to the other hosts; each
// guest's counter, carried in the console log, goes on without a gap.
func drain(t *testing.T, f *fleettest.Fleet) {
	h := f.Hosts[1]
	before, _ := ls(t, f)
	var moving []string
	for name, v := range before {
		if v.Host == h.Name {
			moving = append(moving, name)
		}
	}
	// Counters in the guests that move (the others stay quiet: CPU).
	for _, name := range moving {
		st, err := h.Sup.Status(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		testenv.WaitLog(t, st.ConsoleLog, "VMSUP-SHELL-READY", 2*time.Minute)
		guestRun(t, h, name, `(n=0; while :; do echo "VMSUP-COUNTER $n $n"; n=$((n+1)); sleep 0.2; done) >/dev/console 2>&1 & true`)
		waitFor(t, 30*time.Second, name+"'s counter", func() bool { return len(supervisortest.Counters(st.ConsoleLog)) > 5 })
	}
	t0 := time.Now()
	out, err := f.VMSUP("fleet", "drain", h.Name, "--timeout", "3m")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fleet drain %s (%d VMs) in %s:\n%s", h.Name, len(moving), time.Since(t0).Round(time.Millisecond), out)
	after := waitLs(t, f, time.Minute, "moved VMs running", func(m map[string]fleettest.VM) bool {
		for _, name := range moving {
			if m[name].State != "running" || m[name].Host == h.Name {
				return false
			}
		}
		return true
	})
	for _, name := range moving {
		to := f.Host(after[name].Host)
		st, err := to.Sup.Status(context.Background(), name)
		if err != nil {
			t.Fatalf("%s on %s: %v", name, to.Name, err)
		}
		c := supervisortest.WaitCounterPast(t, st.ConsoleLog, supervisortest.LastCounter(t, st.ConsoleLog)+5, 30*time.Second)
		supervisortest.CheckContinuous(t, c)
		if c[0] != 0 || h.QEMUPID(name) != 0 {
			t.Fatalf("%s: first counter %d (want the guest's history from 0); QEMU left on %s: %d", name, c[0], h.Name, h.QEMUPID(name))
		}
	}
	hosts, _ := f.VMSUP("fleet", "hosts")
	if !strings.Contains(hosts, "draining") {
		t.Errorf("fleet hosts does not show %s draining:\n%s", h.Name, hosts)
	}
	if _, err := f.VMSUP("fleet", "uncordon", h.Name); err != nil {
		t.Fatal(err)
	}
}

// genLoop, run in the guest, keeps a generation counter on /dev/vda: it
// reads the number there, then writes the next one (fsync'd) every 0.2 s
// and prints it on the console once it is on the disk.
const genLoop = `n=$(dd if=/dev/vda bs=16 count=1 2>/dev/null | tr -dc 0-9); n=${n:-0}; echo "VMSUP-GEN-START $n" >/dev/console; ` +
	`(while :; do n=$((n+1)); printf '%-15s\n' $n | dd of=/dev/vda bs=16 count=1 conv=fsync,notrunc 2>/dev/null && echo "VMSUP-GEN $n"; sleep 0.2; done) >/dev/console 2>&1 & true`

var genRE = regexp.MustCompile(`VMSUP-GEN(-START)? (\d+)`)

// lastGen is the last generation a console log shows written (and the
// value a loop started from, if that is all).
func lastGen(log string) int {
	b, _ := os.ReadFile(log)
	m := genRE.FindAllStringSubmatch(string(b), -1)
	if len(m) == 0 {
		return -1
	}
	n, _ := strconv.Atoi(m[len(m)-1][2])
	return n
}

// startGen starts the generation loop in the guest over its console.
func startGen(t *testing.T, h *fleettest.Host, vm string) {
	t.Helper()
	guestRun(t, h, vm, genLoop)
}

// guestRun runs a shell command in the guest over its console.
func guestRun(t *testing.T, h *fleettest.Host, vm, cmd string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sh, err := testenv.DialConsole(ctx, h.Sup.ConsoleSocket(vm))
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	if out, code, err := sh.Run(ctx, cmd); err != nil || code != 0 {
		t.Fatalf("%s on %s: %q: %d %v %q", vm, h.Name, cmd, code, err, out)
	}
}

// lockWatch records the owners of an RBD image's lock over time.
type lockWatch struct {
	mu     sync.Mutex
	owners []string // each new owner ("client.N ADDR") as it appears; "" when unlocked
}

func watchLock(ctx context.Context, c *testenv.Ceph, image string) *lockWatch {
	w := &lockWatch{}
	go func() {
		for ctx.Err() == nil {
			out, err := c.RBD(ctx, "lock", "ls", "--format", "json", image)
			if err == nil {
				owner := lockOwnerOf(out)
				w.mu.Lock()
				if len(w.owners) == 0 || w.owners[len(w.owners)-1] != owner {
					w.owners = append(w.owners, owner)
				}
				w.mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return w
}

// lockOwnerOf reads rbd lock ls --format json (a list, or a map by id).
func lockOwnerOf(out []byte) string {
	type entry struct{ Locker, Address string }
	var list []entry
	if json.Unmarshal(out, &list) != nil {
		var byID map[string]entry
		json.Unmarshal(out, &byID)
		for _, e := range byID {
			list = append(list, e)
		}
	}
	var s []string
	for _, e := range list {
		s = append(s, e.Locker+" "+e.Address)
	}
	return strings.Join(s, "+")
}

func (w *lockWatch) history() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.owners...)
}

// failover: h2's link is cut. Its agent fences itself (kills its VMs), its
// lease expires, the elected scheduler blocklists h2's Ceph client and
// restarts the RBD-only VM on another host, whose disk holds every
// generation written before the cut; the VM with a local disk stays, and
// fleet ls says why. With the link back, h2 takes up its own VM again and
// knows nothing of the moved one.
func failover(t *testing.T, f *fleettest.Fleet, dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := f.Ceph
	h := f.Hosts[1]
	if out, err := c.RBD(ctx, "create", "--size", "16", c.Pool+"/ha"); err != nil {
		t.Fatalf("rbd create: %v %s", err, out)
	}
	key := filepath.Join(dir, "admin.key")
	if err := os.WriteFile(key, []byte(c.AdminKey), 0o600); err != nil {
		t.Fatal(err)
	}
	ha := counterGuest(t, dir, "ha", "128M", fmt.Sprintf(`[[disk]]
name = "data"
type = "rbd"
pool = %q
image = "ha"
ceph_conf = %q
user = "admin"
secret_file = %q
`, c.Pool, c.ClientConf, key))
	local := filepath.Join(dir, "pinned.raw")
	if err := os.WriteFile(local, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	pinned := quietGuest(t, dir, "pinned", "128M", fmt.Sprintf("[placement]\nlabels = {zone = %q}\n\n[[disk]]\nname = \"data\"\nfile = %q\nformat = \"raw\"\n", h.Name, local))
	if _, err := f.VMSUP("fleet", "apply", ha, pinned); err != nil {
		t.Fatal(err)
	}
	vms := waitLs(t, f, 2*time.Minute, "ha and pinned running", func(m map[string]fleettest.VM) bool {
		return m["ha"].State == "running" && m["pinned"].State == "running"
	})
	if vms["ha"].Host != h.Name || vms["pinned"].Host != h.Name {
		t.Fatalf("ha on %s, pinned on %s: want both on %s (the emptiest host)", vms["ha"].Host, vms["pinned"].Host, h.Name)
	}
	st, _ := h.Sup.Status(ctx, "ha")
	testenv.WaitLog(t, st.ConsoleLog, "VMSUP-SHELL-READY", 2*time.Minute)
	startGen(t, h, "ha")
	waitFor(t, 30*time.Second, "generations on ha's disk", func() bool { return lastGen(st.ConsoleLog) > 10 })
	locks := watchLock(ctx, c, c.Pool+"/ha")
	waitFor(t, 10*time.Second, "ha's lock seen", func() bool { hs := locks.history(); return len(hs) > 0 && hs[len(hs)-1] != "" })

	cut := time.Now()
	if err := f.LAN.SetLink(h.SD, false); err != nil {
		t.Fatal(err)
	}
	genAtCut := lastGen(st.ConsoleLog)
	vms = waitLs(t, f, 90*time.Second, "ha running elsewhere", func(m map[string]fleettest.VM) bool {
		return m["ha"].State == "running" && m["ha"].Host != h.Name
	})
	to := f.Host(vms["ha"].Host)
	stTo, err := to.Sup.Status(ctx, "ha")
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitLog(t, stTo.ConsoleLog, "VMSUP-COUNTER", time.Minute)
	took := time.Since(cut)
	t.Logf("FLEET failover: link cut at %s -> the guest's first counter line on %s in %s (TTL 10 s); the agents meanwhile:\n%s",
		cut.UTC().Format("15:04:05.000"), to.Name, took.Round(time.Millisecond), agentLines(f, cut))
	if h.QEMUPID("ha") != 0 || h.QEMUPID("pinned") != 0 {
		t.Errorf("QEMUs left on the cut host: ha %d, pinned %d (the agent must fence itself)", h.QEMUPID("ha"), h.QEMUPID("pinned"))
	}
	if p := vms["pinned"]; p.Host != h.Name || p.State != "lost" || !strings.Contains(p.Reason, "not restarted elsewhere: disk data is a file") {
		t.Errorf("pinned while its host is cut: %+v; want lost, with the local disk as the reason", p)
	}
	// The disk has every generation written before the cut; a new loop
	// goes on from there.
	testenv.WaitLog(t, stTo.ConsoleLog, "VMSUP-SHELL-READY", time.Minute)
	startGen(t, to, "ha")
	waitFor(t, 30*time.Second, "generations on "+to.Name, func() bool { return lastGen(stTo.ConsoleLog) > genAtCut+5 })
	b, _ := os.ReadFile(stTo.ConsoleLog)
	m := regexp.MustCompile(`VMSUP-GEN-START (\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no VMSUP-GEN-START on the new host")
	}
	if start, _ := strconv.Atoi(string(m[1])); start < genAtCut {
		t.Fatalf("the disk on %s starts at generation %d; %d had been written before the cut", to.Name, start, genAtCut)
	} else {
		t.Logf("generation on disk after the failover: %d (the last seen written before the cut: %d)", start, genAtCut)
	}
	// Lock owners: h2's client, then (after its removal) the new one, never
	// back; h2's client blocklisted.
	hist := locks.history()
	var owners []string
	for _, o := range hist {
		if o != "" {
			owners = append(owners, o)
		}
	}
	bl, _ := c.CLI(ctx, "osd", "blocklist", "ls")
	t.Logf("lock owners of rbd/ha: %q; blocklist: %s", hist, strings.TrimSpace(string(bl)))
	if len(owners) != 2 || strings.Contains(owners[1], "+") {
		t.Fatalf("lock owner history %q: want exactly the old owner, then the new one", hist)
	}
	oldAddr := strings.Fields(owners[0])[1]
	if !strings.Contains(string(bl), oldAddr) {
		t.Fatalf("the old owner %s is not blocklisted: %s", oldAddr, bl)
	}
	// The link back: h2's agent takes a new lease, starts its own VM again
	// and forgets the moved one.
	if err := f.LAN.SetLink(h.SD, true); err != nil {
		t.Fatal(err)
	}
	waitLs(t, f, 2*time.Minute, "pinned running again on "+h.Name, func(m map[string]fleettest.VM) bool {
		return m["pinned"].State == "running" && m["pinned"].Host == h.Name
	})
	waitFor(t, 30*time.Second, h.Name+" forgets ha", func() bool {
		_, err := h.Sup.Status(ctx, "ha")
		return err != nil && h.QEMUPID("ha") == 0
	})
	if got := locks.history(); got[len(got)-1] != owners[1] {
		t.Fatalf("the lock changed hands after the link came back: %q", got)
	}
}

// agentLines are the agents' log lines since t, each with its host.
func agentLines(f *fleettest.Fleet, since time.Time) string {
	var out []string
	for _, h := range f.Hosts {
		for _, l := range strings.Split(h.AgentLog(), "\n") {
			i := strings.Index(l, "time=")
			if i < 0 || len(l) < i+29 {
				continue
			}
			if ts, err := time.Parse(time.RFC3339Nano, l[i+5:i+29]); err == nil && ts.After(since) {
				out = append(out, h.Name+": "+l[i:])
			}
		}
	}
	return strings.Join(out, "\n")
}
