package fleettest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/fleet/fleettest"
	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestFleet: 3 etcd members, 3 hosts (agents under their systemd); six VMs
// placed by resources; bad input refused or given a status; an agent
// killed with SIGKILL comes back and re-adopts its VMs; etcd losing one
// member works on, losing two freezes placements but leaves every VM alone.
func TestFleet(t *testing.T) {
	testenv.SkipUnlessRoot(t)
	// Each host offers 4 vCPUs and 1G: six 256M guests go two per host,
	// and a drained host's two fit on the others.
	f := newFleet(t, fleettest.Options{Hosts: 3, CPUs: 4, Memory: "1G", Ceph: true})
	dir := t.TempDir()
	var files []string
	for i := 1; i <= 6; i++ {
		files = append(files, quietGuest(t, dir, fmt.Sprintf("vm%d", i), "256M", ""))
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, h := range f.Hosts {
				t.Logf("agent %s log:\n%s", h.Name, supervisortest.Tail(h.AgentLog(), 3000))
			}
		}
	})
	t.Run("place", func(t *testing.T) {
		out, err := f.VMSUP(append([]string{"fleet", "apply"}, files...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("fleet apply:\n%s", out)
		vms := waitLs(t, f, 4*time.Minute, "six VMs running", func(m map[string]fleettest.VM) bool {
			n := 0
			for _, v := range m {
				if v.State == "running" {
					n++
				}
			}
			return n == 6
		})
		per := map[string][]string{}
		for name, v := range vms {
			per[v.Host] = append(per[v.Host], name)
		}
		for _, h := range f.Hosts {
			got := per[h.Name]
			if len(got) != 2 {
				t.Errorf("host %s runs %v; want two VMs on each host (by free memory)", h.Name, got)
			}
			for _, vm := range got {
				if h.QEMUPID(vm) == 0 {
					t.Errorf("fleet ls says %s runs on %s, but no QEMU there", vm, h.Name)
				}
				for _, o := range f.Hosts {
					if o != h && o.QEMUPID(vm) != 0 {
						t.Errorf("%s also runs on %s", vm, o.Name)
					}
				}
			}
		}
		out, _ = f.VMSUP("fleet", "hosts")
		t.Logf("fleet hosts:\n%s", out)
	})
	if t.Failed() {
		return
	}
	t.Run("bad-input", func(t *testing.T) { badInput(t, f, dir) })
	t.Run("image-pull", func(t *testing.T) { imagePull(t, f, dir) })
	t.Run("agent-kill", func(t *testing.T) { agentKill(t, f) })
	t.Run("drain", func(t *testing.T) { drain(t, f) })
	t.Run("local-disks", func(t *testing.T) { localDisks(t, f, dir) })
	if t.Failed() {
		return
	}
	t.Run("failover", func(t *testing.T) { failover(t, f, dir) })
	t.Run("etcd-quorum", func(t *testing.T) { etcdQuorum(t, f, files[5]) })
}

// badInput: a VM larger than any host and one with a label no host has are
// stored but unschedulable, with the reason; one whose host refuses it
// (its kernel is missing) is failed, with the host's reason; a file that
// fails validation stops the whole apply (the good file beside it is not
// stored either).
func badInput(t *testing.T, f *fleettest.Fleet, dir string) {
	big := quietGuest(t, dir, "big", "4G", "")
	mars := quietGuest(t, dir, "mars", "128M", "[placement]\nlabels = {zone = \"mars\"}")
	if _, err := f.VMSUP("fleet", "apply", big, mars); err != nil {
		t.Fatal(err)
	}
	vms := waitLs(t, f, 30*time.Second, "big and mars unschedulable", func(m map[string]fleettest.VM) bool {
		return m["big"].State == "unschedulable" && m["mars"].State == "unschedulable"
	})
	for name, want := range map[string]string{"big": "needs 1 vCPUs and 4G; no host fits", "mars": "no label zone=mars"} {
		if v := vms[name]; !strings.Contains(v.Reason, want) || v.Host != "" {
			t.Errorf("%s: %+v; want unplaced, reason with %q", name, v, want)
		}
	}
	bad := quietGuest(t, dir, "bad", "lots", "")
	good := quietGuest(t, dir, "good", "128M", "")
	_, err := f.VMSUP("fleet", "apply", good, bad)
	if err == nil || !strings.Contains(err.Error(), "bad.toml:2:") || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("apply of an invalid file: %v; want an error naming bad.toml's line and field", err)
	}
	vms, _ = ls(t, f)
	if _, ok := vms["good"]; ok {
		t.Errorf("good.toml was stored though the apply failed")
	}
	if _, ok := vms["bad"]; ok {
		t.Errorf("bad.toml was stored")
	}
	// Valid as a file, refused by the host that gets it (its kernel is
	// nowhere, in a place the hosts allow): failed, with the host's
	// one-line reason, and no QEMU.
	nok := quietGuest(t, dir, "nokernel", "128M", "")
	b, _ := os.ReadFile(nok)
	os.WriteFile(nok, []byte(strings.Replace(string(b), env.Guest.Kernel, filepath.Join(dir, "nonexistent/vmlinuz"), 1)), 0o644)
	if _, err := f.VMSUP("fleet", "apply", nok); err != nil {
		t.Fatal(err)
	}
	vms = waitLs(t, f, time.Minute, "nokernel failed", func(m map[string]fleettest.VM) bool { return m["nokernel"].State == "failed" })
	if v := vms["nokernel"]; !strings.Contains(v.Reason, filepath.Join(dir, "nonexistent/vmlinuz")) || v.Host == "" {
		t.Errorf("nokernel: %+v; want failed on its host, naming the kernel", v)
	}
	t.Logf("a spec its host refuses: %+v", vms["nokernel"])
	for _, h := range f.Hosts {
		if h.QEMUPID("nokernel") != 0 {
			t.Errorf("nokernel's QEMU runs on %s", h.Name)
		}
	}
	for _, name := range []string{"big", "mars", "nokernel"} {
		if _, err := f.VMSUP("fleet", "rm", name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.VMSUP("fleet", "rm", "nosuch"); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("fleet rm nosuch: %v", err)
	}
}

// agentKill: SIGKILL to h1's agent; its QEMUs run on, systemd restarts it,
// it takes its lease back (the host never looked lost) and re-adopts them.
func agentKill(t *testing.T, f *fleettest.Fleet) {
	h := f.Hosts[0]
	before, _ := ls(t, f)
	var mine []string
	qemus := map[string]int{}
	for name, v := range before {
		if v.Host == h.Name {
			mine = append(mine, name)
			qemus[name] = h.QEMUPID(name)
		}
	}
	slices.Sort(mine)
	old := h.AgentPID()
	if old == 0 || len(mine) == 0 {
		t.Fatalf("agent pid %d, VMs %v", old, mine)
	}
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for h.AgentPID() == 0 || h.AgentPID() == old {
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not come back")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// It re-registers with its lease and reports its VMs again.
	waitFor(t, 30*time.Second, "the agent takes its lease back", func() bool {
		return strings.Contains(h.AgentLog(), "reused=true")
	})
	time.Sleep(3 * time.Second) // a few reconcile passes
	after, _ := ls(t, f)
	for _, name := range mine {
		if after[name].Host != h.Name || after[name].State != "running" {
			t.Errorf("%s after the agent's restart: %+v", name, after[name])
		}
		if p := h.QEMUPID(name); p != qemus[name] {
			t.Errorf("%s: QEMU pid %d -> %d: the agent's restart touched it", name, qemus[name], p)
		}
	}
	t.Logf("agent %d killed, %d re-adopted %v with their QEMUs untouched", old, h.AgentPID(), mine)
}

// etcdQuorum: one member down, the fleet works (a VM removed and applied
// again); two down, no quorum: apply fails and says so, fleet ls shows the
// last known state with a note, and no agent touches a VM for longer than a
// lease's TTL; quorum back, the apply goes through.
func etcdQuorum(t *testing.T, f *fleettest.Fleet, file string) {
	qemus := map[string]int{}
	vms, _ := ls(t, f)
	for name, v := range vms {
		for _, h := range f.Hosts {
			if h.Name == v.Host {
				qemus[name] = h.QEMUPID(name)
			}
		}
	}
	if err := f.Etcd.StopMember(0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.VMSUP("fleet", "rm", "vm6"); err != nil {
		t.Fatalf("rm with 2 of 3 members: %v", err)
	}
	waitLs(t, f, time.Minute, "vm6 gone", func(m map[string]fleettest.VM) bool { _, ok := m["vm6"]; return !ok })
	waitFor(t, time.Minute, "vm6's QEMU stopped", func() bool {
		for _, h := range f.Hosts {
			if h.QEMUPID("vm6") != 0 {
				return false
			}
		}
		return true
	})
	delete(qemus, "vm6")
	if err := f.Etcd.StopMember(1); err != nil {
		t.Fatal(err)
	}
	_, err := f.VMSUP("fleet", "apply", file)
	if err == nil || !strings.Contains(err.Error(), "no quorum") {
		t.Fatalf("apply with 1 of 3 members: %v; want a no-quorum error", err)
	}
	t.Logf("apply without quorum: %v", err)
	lsVMs, note := ls(t, f)
	if !strings.Contains(note, "no quorum") || len(lsVMs) != len(vms)-1 {
		t.Errorf("fleet ls without quorum: note %q, %d VMs; want the note and the %d VMs", note, len(lsVMs), len(vms)-1)
	}
	time.Sleep(12 * time.Second) // past the TTL (10 s) and the self-fence point (7 s)
	for name, pid := range qemus {
		for _, h := range f.Hosts {
			if p := h.QEMUPID(name); p != 0 && p != pid {
				t.Errorf("%s: QEMU changed without quorum", name)
			}
		}
		found := false
		for _, h := range f.Hosts {
			found = found || h.QEMUPID(name) == pid
		}
		if !found {
			t.Errorf("%s (QEMU %d) stopped while etcd had no quorum", name, pid)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := f.Etcd.RestartMember(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := f.VMSUP("fleet", "apply", file); err != nil {
		t.Fatalf("apply with quorum back: %v", err)
	}
	waitLs(t, f, 2*time.Minute, "vm6 running again", func(m map[string]fleettest.VM) bool { return m["vm6"].State == "running" })
	// Quorum back, the agents renew their leases: nobody fences itself.
	time.Sleep(5 * time.Second)
	for name, pid := range qemus {
		found := false
		for _, h := range f.Hosts {
			found = found || h.QEMUPID(name) == pid
		}
		if !found {
			t.Errorf("%s (QEMU %d) was stopped after quorum came back", name, pid)
		}
	}
}
