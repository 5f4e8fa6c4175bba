package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	clientv3 "go.etcd.io/etcd/client/v3"

	vmfleet "github.com/vmsup/vmsup/fleet"
	"github.com/vmsup/vmsup/fleet/fleettest"
	"github.com/vmsup/vmsup/internal/dev/bench"
	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/internal/dev/testenv/etcdtest"
	"github.com/vmsup/vmsup/spec"
)

const secFleet = "9. fleet (etcd 3 members with TLS, hosts in network namespaces)"

// fleetSection runs the fleet's figures in a child process of its own
// network namespace (the LAN's bridge, etcd and Ceph live there, never on
// the host's interfaces), and adds the rows it reports.
func (f *fixture) fleetSection(ctx context.Context) error {
	out := filepath.Join(f.dir, "fleet-rows.json")
	cmd := exec.CommandContext(ctx, os.Args[0], "-fleet-child", filepath.Join(f.dir, "fleet"), "-vmsup", f.vmsupBin, "-fleet-out", out)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("fleet child: %w", err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return err
	}
	var rows []bench.Row
	if err := json.Unmarshal(b, &rows); err != nil {
		return err
	}
	for _, r := range rows {
		f.report.Add(r)
	}
	return nil
}

// fleetChild is the child: it measures and writes its rows to out.
func fleetChild(dir, vmsupBin, out string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if lo, err := netlink.LinkByName("lo"); err == nil {
		netlink.LinkSetUp(lo)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	env, err := testenv.Start(ctx, filepath.Join(dir, "env"))
	if err != nil {
		return err
	}
	defer env.Close()
	var rows []bench.Row
	step("fleet: placement decisions")
	r, err := placements(ctx, filepath.Join(dir, "place"))
	if err != nil {
		return err
	}
	rows = append(rows, r...)
	step("fleet: a drain, agent memory")
	r, err = drainAndMemory(ctx, env, vmsupBin, filepath.Join(dir, "drain"))
	if err != nil {
		return err
	}
	rows = append(rows, r...)
	step("fleet: failover")
	r, err = failovers(ctx, env, vmsupBin, filepath.Join(dir, "failover"))
	if err != nil {
		return err
	}
	rows = append(rows, r...)
	b, _ := json.Marshal(rows)
	return os.WriteFile(out, b, 0o644)
}

// placements: 200 VMs applied at once to 10 registered hosts; one
// scheduler pass places them all, each decision timed.
func placements(ctx context.Context, dir string) ([]bench.Row, error) {
	c, err := etcdtest.Start(ctx, dir, etcdtest.Options{TLS: true})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	cl, err := c.Client(ctx)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	s := vmfleet.NewStore(cl, "/bench/")
	for i := range 10 {
		if err := s.PutHost(ctx, vmfleet.Host{Name: fmt.Sprintf("h%d", i), CPUs: 64, Memory: 64 << 30}, clientv3.NoLease); err != nil {
			return nil, err
		}
	}
	var files []*spec.File
	for i := range 200 {
		f, err := spec.Parse(filepath.Join(dir, "vm.toml"), fmt.Appendf(nil, "name = \"vm%d\"\nmemory = \"%dM\"\n[boot]\nkernel = \"/vmlinuz\"\n", i, 256+i%4*256))
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	if _, err := s.Apply(ctx, files...); err != nil {
		return nil, err
	}
	var took []float64
	sch := &vmfleet.Scheduler{Store: s, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Decided: func(_ string, d time.Duration) { took = append(took, ms(d)) }}
	t0 := time.Now()
	if err := sch.Pass(ctx); err != nil {
		return nil, err
	}
	pass := time.Since(t0)
	return []bench.Row{{Section: secFleet, Figure: "placement decision (choice + compare-and-swap)", Variant: "scheduler", Accel: "-", Unit: "ms",
		Summary: bench.Summarize(took), ShowP99: true,
		Note: fmt.Sprintf("200 VMs, 10 hosts, one pass of %s (one read of the fleet)", pass.Round(time.Millisecond))}}, nil
}

// drainAndMemory: 10 idle VMs on h1 of two hosts, drained to h2 (timed);
// the agents' resident memory with 10 VMs, then with 100.
func drainAndMemory(ctx context.Context, env *testenv.Env, vmsupBin, dir string) ([]bench.Row, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	fl, err := fleettest.Start(ctx, env, vmsupBin, dir, fleettest.Options{Hosts: 2, CPUs: 128, Memory: "8G"})
	if err != nil {
		return nil, err
	}
	defer fl.Close()
	blank := filepath.Join(dir, "blank.img")
	if err := os.WriteFile(blank, make([]byte, 1<<20), 0o644); err != nil {
		return nil, err
	}
	var files []string
	for i := range 100 {
		p, err := specFile(dir, fmt.Sprintf("idle%d", i), kindIdleTCG, 64, blank, guestFiles{})
		if err != nil {
			return nil, err
		}
		files = append(files, p)
	}
	running := func(n int, host string) func(map[string]fleettest.VM) bool {
		return func(m map[string]fleettest.VM) bool {
			k := 0
			for _, v := range m {
				if v.State == "running" && v.Host == host {
					k++
				}
			}
			return k == n
		}
	}
	if _, err := fl.VMSUP("fleet", "drain", "h2"); err != nil { // all on h1 first
		return nil, err
	}
	if _, err := fl.VMSUP(append([]string{"fleet", "apply"}, files[:10]...)...); err != nil {
		return nil, err
	}
	if _, err := fl.WaitLs(ctx, 5*time.Minute, running(10, "h1")); err != nil {
		return nil, err
	}
	rss10 := float64(rssOf(fl.Hosts[0].AgentPID())) / (1 << 20)
	if _, err := fl.VMSUP("fleet", "uncordon", "h2"); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if _, err := fl.VMSUP("fleet", "drain", "h1", "--timeout", "10m"); err != nil {
		return nil, err
	}
	if _, err := fl.WaitLs(ctx, 5*time.Minute, running(10, "h2")); err != nil {
		return nil, err
	}
	drain := time.Since(t0)
	if _, err := fl.VMSUP(append([]string{"fleet", "apply"}, files...)...); err != nil {
		return nil, err
	}
	if _, err := fl.WaitLs(ctx, 15*time.Minute, running(100, "h2")); err != nil {
		return nil, err
	}
	time.Sleep(5 * time.Second) // a few reconcile passes over all of them
	rss100 := float64(rssOf(fl.Hosts[1].AgentPID())) / (1 << 20)
	return []bench.Row{
		{Section: secFleet, Figure: "drain a host with 10 idle VMs (live migrations, one after another)", Variant: "fleet drain", Accel: "tcg", Unit: "ms",
			Summary: bench.Summarize([]float64{ms(drain)}), Note: "64 MiB VMs, no guest OS; until all run on the other host"},
		{Section: secFleet, Figure: "agent resident memory, 10 VMs", Variant: "vmsup agent", Accel: "-", Unit: "MiB",
			Summary: bench.Summarize([]float64{rss10})},
		{Section: secFleet, Figure: "agent resident memory, 100 VMs", Variant: "vmsup agent", Accel: "-", Unit: "MiB",
			Summary: bench.Summarize([]float64{rss100})},
	}, nil
}

// failovers: a test guest with an RBD disk; its host's link is cut; timed
// from the cut to the guest's first console line on the other host, three
// times (back and forth).
func failovers(ctx context.Context, env *testenv.Env, vmsupBin, dir string) ([]bench.Row, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	fl, err := fleettest.Start(ctx, env, vmsupBin, dir, fleettest.Options{Hosts: 2, Ceph: true})
	if err != nil {
		return nil, err
	}
	defer fl.Close()
	c := fl.Ceph
	if out, err := c.RBD(ctx, "create", "--size", "16", c.Pool+"/ha"); err != nil {
		return nil, fmt.Errorf("rbd create: %v %s", err, out)
	}
	key := filepath.Join(dir, "admin.key")
	if err := os.WriteFile(key, []byte(c.AdminKey), 0o600); err != nil {
		return nil, err
	}
	path, err := fleettest.CounterGuest(env, dir, "ha", "128M", fmt.Sprintf("[[disk]]\nname = \"data\"\ntype = \"rbd\"\npool = %q\nimage = \"ha\"\nceph_conf = %q\nuser = \"admin\"\nsecret_file = %q\n",
		c.Pool, c.ClientConf, key))
	if err != nil {
		return nil, err
	}
	if _, err := fl.VMSUP("fleet", "apply", path); err != nil {
		return nil, err
	}
	var took []float64
	for range 3 {
		vms, err := fl.WaitLs(ctx, 3*time.Minute, func(m map[string]fleettest.VM) bool { return m["ha"].State == "running" })
		if err != nil {
			return nil, err
		}
		from := fl.Host(vms["ha"].Host)
		time.Sleep(3 * time.Second) // booted far enough to have opened its disk
		t0 := time.Now()
		if err := fl.LAN.SetLink(from.SD, false); err != nil {
			return nil, err
		}
		vms, err = fl.WaitLs(ctx, 2*time.Minute, func(m map[string]fleettest.VM) bool { return m["ha"].State == "running" && m["ha"].Host != from.Name })
		if err != nil {
			return nil, err
		}
		st, err := fl.Host(vms["ha"].Host).Sup.Status(ctx, "ha")
		if err != nil {
			return nil, err
		}
		if err := waitFor(ctx, time.Minute, func() bool { return firstCounter(st.ConsoleLog) }); err != nil {
			return nil, err
		}
		took = append(took, ms(time.Since(t0)))
		if err := fl.LAN.SetLink(from.SD, true); err != nil {
			return nil, err
		}
		// Its agent back, the old host forgets the VM before the next cut.
		if err := waitFor(ctx, 2*time.Minute, func() bool { _, err := from.Sup.Status(ctx, "ha"); return err != nil }); err != nil {
			return nil, err
		}
	}
	return []bench.Row{{Section: secFleet, Figure: "failover: link cut to the guest's first console line on the other host", Variant: "fleet", Accel: "tcg", Unit: "ms",
		Summary: bench.Summarize(took), Limit: 30000, Note: "TTL 10 s (self-fence at 7 s), Ceph fencing, then a TCG boot of the test guest"}}, nil
}

var counterLine = regexp.MustCompile(`VMSUP-COUNTER \d+`)

func firstCounter(log string) bool {
	b, _ := os.ReadFile(log)
	return counterLine.Match(b)
}

func waitFor(ctx context.Context, d time.Duration, ok func() bool) error {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not within %s", d)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}
