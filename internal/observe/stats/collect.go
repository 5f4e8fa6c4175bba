package stats

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"github.com/vmsup/vmsup/internal/lifecycle/livesettings"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/observe/iohealth"
	"github.com/vmsup/vmsup/internal/observe/status"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Collecting the figures of a state root's VMs (vmsup stats, metrics): the
// unit's accounting from systemd, /proc, the taps' counters, and over each
// VM's monitor its disks, balloon and run state. It only reads.

// Collector reads the VMs' figures of one Env.
type Collector struct{ env *machine.Env }

// NewCollector returns a collector over env.
func NewCollector(env *machine.Env) *Collector { return &Collector{env: env} }

// The states a collection reports by itself, in the supervisor's words
// (its State values are these).
const (
	StateShutOff = "shut off" // no unit; the VM's state directory exists
	StateCrashed = "crashed"  // the unit failed: QEMU died abnormally
	StateUnknown = "unknown"  // unit active but QEMU does not answer
)

// workers bounds the VMs Stats reads at once: each costs a few systemd
// calls and a QMP session, nearly all of it waiting for QEMUs, which on a
// busy host answer slowly (100 TCG VMs on 2 cores: tens of ms per QMP
// round trip), so a scrape of 100 waits for all at once.
const workers = 128

// qmpTimeout bounds one VM's QMP part: a scrape must not hang on one VM
// whose monitor another command holds.
const qmpTimeout = 2 * time.Second

// BalloonPath is the balloon device's QOM path.
const BalloonPath = livesettings.BalloonPath

// pidFinder finds the VMs' QEMUs in our PID namespace: systemd's MainPID
// when that is it (systemd is PID 1 of ours), else by -name among /proc's
// processes (a systemd in a PID namespace of its own), read once for all.
type pidFinder struct {
	store  vmstore.Store
	once   sync.Once
	byName map[string]int
}

// Stats reads the figures of the named VMs (every VM vmsup knows when none
// is named). It only reads: systemd's accounting, /proc, QMP queries and
// the taps' counters. A VM being started or stopped is skipped; a named VM
// that does not exist is an error.
func (c *Collector) Stats(ctx context.Context, names ...string) ([]VM, []Skipped, error) {
	if len(names) == 0 {
		all, err := c.env.State().Known()
		if err != nil {
			return nil, nil, err
		}
		names = all
	} else {
		for _, n := range names {
			if _, err := os.Stat(c.env.State().Paths(n).Dir); err != nil {
				return nil, nil, c.env.Absent(n)
			}
		}
	}
	sd, err := c.env.Systemd(ctx)
	if err != nil {
		return nil, nil, err
	}
	pids := &pidFinder{store: c.env.State()}
	cgroupRoot, _ := CgroupV2Mount() // once: it reads /proc/self/mountinfo
	out := make([]VM, len(names))
	skip := make([]*Skipped, len(names))
	errs := make([]error, len(names))
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, len(names)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				out[i], skip[i], errs[i] = c.statsOf(ctx, sd, pids, cgroupRoot, names[i])
			}
		}()
	}
	for i := range names {
		work <- i
	}
	close(work)
	wg.Wait()
	var vms []VM
	var skipped []Skipped
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
func (c *Collector) statsOf(ctx context.Context, sd *units.Manager, pids *pidFinder, cgroupRoot, name string) (VM, *Skipped, error) {
	v := VM{Name: name, State: StateShutOff, Disks: []Disk{}, NICs: []NIC{}}
	st, err := sd.StatsStatus(ctx, c.env.State().UnitOf(name))
	if err != nil {
		return v, nil, vmerr.Wrap(name, err)
	}
	switch st.ActiveState {
	case "activating":
		return v, &Skipped{Name: name, Reason: "starting"}, nil
	case "deactivating":
		return v, &Skipped{Name: name, Reason: "stopping"}, nil
	case "failed":
		v.State = StateCrashed
		return v, nil, nil
	case "active":
	default:
		return v, nil, nil
	}
	v.CPU.UsageSeconds = float64(st.CPUUsageNSec) / 1e9
	if cgroupRoot != "" && st.ControlGroup != "" {
		if u, us, sy, err := CgroupCPU(filepath.Join(cgroupRoot, st.ControlGroup)); err == nil {
			v.CPU.UsageSeconds, v.CPU.UserSeconds, v.CPU.SystemSeconds = u, us, sy
		}
	}
	v.Memory.RSSBytes = st.MemoryCurrent
	if !st.Since.IsZero() {
		since := st.Since
		v.StartTime, v.Uptime = &since, time.Since(since).Seconds()
	}
	if pid := pids.qemu(st.MainPID, name); pid > 0 {
		v.CPU.DelaySeconds, _ = SchedDelay(pid)
	}
	v.NICs = append(v.NICs, c.tapStats(name)...)
	qctx, cancel := context.WithTimeout(ctx, qmpTimeout)
	defer cancel()
	mon, release, err := c.env.QMPSession(qctx, name)
	if err != nil {
		v.State = StateUnknown
		return v, nil, nil // its QEMU does not answer now: reported down, never a failed scrape
	}
	defer release()
	// Both queries at once (the client matches replies by id): one wait
	// for a busy QEMU instead of two.
	disks := make(chan []Disk, 1)
	go func() { disks <- diskStats(qctx, mon) }()
	qs, err := mon.QueryStatus(qctx)
	v.Disks = append(v.Disks, <-disks...)
	if err != nil {
		v.State = StateUnknown
		return v, nil, nil
	}
	state, _ := status.QEMUState(qs)
	v.Up, v.State = true, string(state)
	c.qemuStats(qctx, mon, name, &v)
	return v, nil, nil
}

// qemuStats adds the vCPUs, the balloon and the guest's memory.
func (c *Collector) qemuStats(ctx context.Context, mon *qmp.Conn, name string, v *VM) {
	// vCPUs from the record, not QMP: every round trip to a busy QEMU
	// counts when one scrape reads a hundred.
	var vm *spec.VM
	if view, _ := c.env.View(name); view != nil {
		vm = view.Spec // with live resizes: the vCPUs the guest has now
		v.CPU.VCPUs = vm.CPUs
	}
	if vm != nil && vm.Balloon {
		v.Memory.BalloonActualBytes, _ = mon.QueryBalloon(ctx)
		var gs qmp.BalloonGuestStats
		if mon.QOMGet(ctx, BalloonPath, "guest-stats", &gs) == nil && gs.LastUpdate > 0 {
			v.Memory.GuestTotalBytes, v.Memory.GuestFreeBytes, v.Memory.GuestAvailableBytes =
				positive(gs.Stats.Total), positive(gs.Stats.Free), positive(gs.Stats.Available)
		}
	}
}

func positive(n int64) uint64 { return uint64(max(n, 0)) }

// diskStats maps query-blockstats to the VM's disks by device id
// ("disk-NAME", boot-time or hot-plugged alike).
func diskStats(ctx context.Context, c *qmp.Conn) []Disk {
	bs, err := c.QueryBlockstats(ctx)
	if err != nil {
		return nil
	}
	var out []Disk
	idle := false
	for _, b := range bs {
		id, _, _ := strings.Cut(strings.TrimPrefix(b.QdevID, "/machine/peripheral/"), "/")
		name, ok := strings.CutPrefix(id, "disk-")
		if !ok {
			continue
		}
		st := b.Stats
		out = append(out, Disk{Name: name, ReadBytes: st.ReadBytes, WriteBytes: st.WriteBytes,
			ReadOps: st.ReadOps, WriteOps: st.WriteOps, FlushOps: st.FlushOps,
			ReadTimeSeconds: float64(st.ReadTimeNanos) / 1e9, WriteTimeSeconds: float64(st.WriteTimeNanos) / 1e9,
			FlushTimeSeconds: float64(st.FlushTimeNanos) / 1e9})
		if st.IdleTimeNanos != nil && time.Duration(*st.IdleTimeNanos) >= iohealth.DefaultBound {
			idle = true
		}
	}
	if idle {
		markStalled(ctx, c, out)
	}
	return out
}

// markStalled marks the disks whose requests stall. It costs a few QMP
// round trips (the virtio queues), so it is only asked when some disk has
// had no request end for the bound: a disk that is busy, or idle, is
// never stalled.
func markStalled(ctx context.Context, c *qmp.Conn, disks []Disk) {
	s, err := iohealth.Read(ctx, c)
	if err != nil {
		return
	}
	for _, d := range s.Disks {
		if i := slices.IndexFunc(disks, func(x Disk) bool { return x.Name == d.Name }); i >= 0 {
			disks[i].Stalled = iohealth.StalledNow(d, iohealth.DefaultBound)
		}
	}
}

// tapStats reads the counters of the VM's taps, in their namespaces.
func (c *Collector) tapStats(name string) []NIC {
	var out []NIC
	for _, t := range c.env.Net().Taps(name) {
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
		n, err := TapCounters(h, t.Tap)
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

func (f *pidFinder) qemu(mainPID uint32, name string) int {
	qmpPath := []byte(f.store.Paths(name).QMP) // this root's VM, not a namesake of another root's
	isIt := func(pid int) bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		return err == nil && bytes.Contains(b, qmpPath) && vmstore.QEMUName(b) == name
	}
	if mainPID > 0 && isIt(int(mainPID)) {
		return int(mainPID)
	}
	f.once.Do(func() {
		f.byName = map[string]int{}
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			if pid, err := strconv.Atoi(e.Name()); err == nil {
				if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && vmstore.QEMUName(b) != "" {
					f.byName[vmstore.QEMUName(b)] = pid
				}
			}
		}
	})
	if pid := f.byName[name]; pid > 0 && isIt(pid) {
		return pid
	}
	return 0
}
