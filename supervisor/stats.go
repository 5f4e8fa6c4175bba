package supervisor

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vmsup/vmsup/internal/vmstats"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// VMStats are one VM's figures: CPU, memory, disks, NICs, uptime
// (internal/vmstats says where each comes from).
type VMStats = vmstats.VM

// StatsSkipped is a VM Stats left out, and why (being started or stopped).
type StatsSkipped = vmstats.Skipped

// statsWorkers bounds the VMs Stats reads at once: each costs a few
// systemd calls and a QMP session, nearly all of it waiting for QEMUs,
// which on a busy host answer slowly (100 TCG VMs on 2 cores: tens of ms
// per QMP round trip), so a scrape of 100 waits for all at once.
const statsWorkers = 128

// statsTimeout bounds one VM's QMP part: a scrape must not hang on one VM
// whose monitor another command holds.
const statsTimeout = 2 * time.Second

// Stats reads the figures of the named VMs (every VM vmsup knows when none
// is named). It only reads: systemd's accounting, /proc, QMP queries and
// the taps' counters. A VM being started or stopped is skipped; a named VM
// that does not exist is an error.
func (s *Supervisor) Stats(ctx context.Context, names ...string) ([]VMStats, []StatsSkipped, error) {
	if len(names) == 0 {
		all, err := s.state.Known()
		if err != nil {
			return nil, nil, err
		}
		names = all
	} else {
		for _, n := range names {
			if _, err := os.Stat(s.paths(n).Dir); err != nil {
				return nil, nil, s.absent(n)
			}
		}
	}
	sd, err := s.systemd(ctx)
	if err != nil {
		return nil, nil, err
	}
	pids := &pidFinder{s: s}
	cgroupRoot, _ := vmstats.CgroupV2Mount() // once: it reads /proc/self/mountinfo
	out := make([]VMStats, len(names))
	skip := make([]*StatsSkipped, len(names))
	errs := make([]error, len(names))
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(statsWorkers, len(names)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				out[i], skip[i], errs[i] = s.statsOf(ctx, sd, pids, cgroupRoot, names[i])
			}
		}()
	}
	for i := range names {
		work <- i
	}
	close(work)
	wg.Wait()
	var vms []VMStats
	var skipped []StatsSkipped
	for i := range names {
		switch {
		case errs[i] != nil:
			return nil, nil, errs[i]
		case skip[i] != nil:
			skipped = append(skipped, *skip[i])
		default:
			vms = append(vms, out[i])
		}
	}
	return vms, skipped, nil
}

// statsOf reads one VM.
func (s *Supervisor) statsOf(ctx context.Context, sd *units.Manager, pids *pidFinder, cgroupRoot, name string) (VMStats, *StatsSkipped, error) {
	v := VMStats{Name: name, State: string(StateShutOff), Disks: []vmstats.Disk{}, NICs: []vmstats.NIC{}}
	st, err := sd.StatsStatus(ctx, s.state.UnitOf(name))
	if err != nil {
		return v, nil, vmErr(name, err)
	}
	switch st.ActiveState {
	case "activating":
		return v, &StatsSkipped{Name: name, Reason: "starting"}, nil
	case "deactivating":
		return v, &StatsSkipped{Name: name, Reason: "stopping"}, nil
	case "failed":
		v.State = string(StateCrashed)
		return v, nil, nil
	case "active":
	default:
		return v, nil, nil
	}
	v.CPU.UsageSeconds = float64(st.CPUUsageNSec) / 1e9
	if cgroupRoot != "" && st.ControlGroup != "" {
		if u, us, sy, err := vmstats.CgroupCPU(filepath.Join(cgroupRoot, st.ControlGroup)); err == nil {
			v.CPU.UsageSeconds, v.CPU.UserSeconds, v.CPU.SystemSeconds = u, us, sy
		}
	}
	v.Memory.RSSBytes = st.MemoryCurrent
	if !st.Since.IsZero() {
		since := st.Since
		v.StartTime, v.Uptime = &since, time.Since(since).Seconds()
	}
	if pid := pids.qemu(st.MainPID, name); pid > 0 {
		v.CPU.DelaySeconds, _ = vmstats.SchedDelay(pid)
	}
	v.NICs = append(v.NICs, s.tapStats(name)...)
	qctx, cancel := context.WithTimeout(ctx, statsTimeout)
	defer cancel()
	c, release, err := s.qmpSession(qctx, name)
	if err != nil {
		v.State = string(StateUnknown)
		return v, nil, nil // its QEMU does not answer now: reported down, never a failed scrape
	}
	defer release()
	// Both queries at once (the client matches replies by id): one wait
	// for a busy QEMU instead of two.
	disks := make(chan []vmstats.Disk, 1)
	go func() { disks <- diskStats(qctx, c) }()
	qs, err := c.QueryStatus(qctx)
	v.Disks = append(v.Disks, <-disks...)
	if err != nil {
		v.State = string(StateUnknown)
		return v, nil, nil
	}
	state, _ := qemuState(qs)
	v.Up, v.State = true, string(state)
	s.qemuStats(qctx, c, name, &v)
	return v, nil, nil
}

// qemuStats adds the vCPUs, the balloon and the guest's memory.
func (s *Supervisor) qemuStats(ctx context.Context, c *qmp.Conn, name string, v *VMStats) {
	// vCPUs from the record, not QMP: every round trip to a busy QEMU
	// counts when one scrape reads a hundred.
	var vm *spec.VM
	if view, _ := s.view(name); view != nil {
		vm = view.Spec // with live resizes: the vCPUs the guest has now
		v.CPU.VCPUs = vm.CPUs
	}
	if vm != nil && vm.Balloon {
		v.Memory.BalloonActualBytes, _ = c.QueryBalloon(ctx)
		var gs qmp.BalloonGuestStats
		if c.QOMGet(ctx, balloonPath, "guest-stats", &gs) == nil && gs.LastUpdate > 0 {
			v.Memory.GuestTotalBytes, v.Memory.GuestFreeBytes, v.Memory.GuestAvailableBytes =
				positive(gs.Stats.Total), positive(gs.Stats.Free), positive(gs.Stats.Available)
		}
	}
}

// balloonPath is the balloon device's QOM path.
const balloonPath = "/machine/peripheral/balloon"

// balloonStatsInterval is how often the guest's balloon driver reports its
// memory (seconds), set when QEMU starts: without it there are no figures.
const balloonStatsInterval = 5

func positive(n int64) uint64 { return uint64(max(n, 0)) }

// qemuState is QEMU's run state in vmsup's words, and why when that is
// not one vmsup expects of a live QEMU.
func qemuState(qs qmp.StatusInfo) (State, string) {
	switch {
	case qs.Running:
		return StateRunning, ""
	case qs.Status == "paused" || qs.Status == "suspended":
		return StatePaused, ""
	case qs.Status == "guest-panicked":
		return StatePanicked, "" // vmsup events NAME shows the GUEST_PANICKED
	case qs.Status == "shutdown" || qs.Status == "internal-error" || qs.Status == "io-error":
		return StateUnknown, "QEMU status " + qs.Status
	}
	return State(strings.ReplaceAll(qs.Status, "-", " ")), ""
}

// diskStats maps query-blockstats to the VM's disks by device id
// ("disk-NAME", boot-time or hot-plugged alike).
func diskStats(ctx context.Context, c *qmp.Conn) []vmstats.Disk {
	bs, err := c.QueryBlockstats(ctx)
	if err != nil {
		return nil
	}
	var out []vmstats.Disk
	for _, b := range bs {
		id, _, _ := strings.Cut(strings.TrimPrefix(b.QdevID, "/machine/peripheral/"), "/")
		name, ok := strings.CutPrefix(id, "disk-")
		if !ok {
			continue
		}
		st := b.Stats
		out = append(out, vmstats.Disk{Name: name, ReadBytes: st.ReadBytes, WriteBytes: st.WriteBytes,
			ReadOps: st.ReadOps, WriteOps: st.WriteOps, FlushOps: st.FlushOps,
			ReadTimeSeconds: float64(st.ReadTimeNanos) / 1e9, WriteTimeSeconds: float64(st.WriteTimeNanos) / 1e9,
			FlushTimeSeconds: float64(st.FlushTimeNanos) / 1e9})
	}
	return out
}

// tapStats reads the counters of the VM's taps, in their namespaces.
func (s *Supervisor) tapStats(name string) []vmstats.NIC {
	var out []vmstats.NIC
	for _, t := range s.net().Taps(name) {
		var h *netlink.Handle
		if t.Netns != "" {
			ns, err := netns.GetFromPath(t.Netns)
			if err != nil {
				continue
			}
			h, err = netlink.NewHandleAt(ns)
			ns.Close()
			if err != nil {
				continue
			}
		}
		n, err := vmstats.TapCounters(h, t.Tap)
		if h != nil {
			h.Close()
		}
		if err != nil {
			continue
		}
		n.Name = t.NIC
		out = append(out, n)
	}
	return out
}

// pidFinder finds the VMs' QEMUs in our PID namespace: systemd's MainPID
// when that is it (systemd is PID 1 of ours), else by -name among /proc's
// processes (a systemd in a PID namespace of its own), read once for all.
type pidFinder struct {
	s      *Supervisor
	once   sync.Once
	byName map[string]int
}

func (f *pidFinder) qemu(mainPID uint32, name string) int {
	qmpPath := []byte(f.s.paths(name).QMP) // this root's VM, not a namesake of another root's
	isIt := func(pid int) bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		return err == nil && bytes.Contains(b, qmpPath) && qemuName(b) == name
	}
	if mainPID > 0 && isIt(int(mainPID)) {
		return int(mainPID)
	}
	f.once.Do(func() {
		f.byName = map[string]int{}
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			if pid, err := strconv.Atoi(e.Name()); err == nil {
				if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && qemuName(b) != "" {
					f.byName[qemuName(b)] = pid
				}
			}
		}
	})
	if pid := f.byName[name]; pid > 0 && isIt(pid) {
		return pid
	}
	return 0
}

// qemuName is the VM name in a QEMU's command line (cmdline: -name
// guest=NAME,...), "" if none.
// qemuPID is the QEMU of VM name listening on qmpPath, as this process
// sees it (0: none): a migration's two QEMUs of one VM differ by socket.
func qemuPID(name, qmpPath string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && qemuName(b) == name && bytes.Contains(b, []byte(qmpPath)) {
			return pid
		}
	}
	return 0
}

func qemuName(cmdline []byte) string {
	_, after, ok := bytes.Cut(cmdline, []byte("\x00-name\x00guest="))
	if !ok {
		return ""
	}
	name, _, _ := bytes.Cut(after, []byte(","))
	return string(name)
}
