// Command vmsup-bench measures vmsup side by side with raw QEMU and with
// libvirt on this machine, in one run, interleaving the variants so noise
// hits all alike: start, stop, boot to the guest's console marker, resident
// memory, scale to many VMs, and QMP latency. It prints a table and writes it
// as Markdown and JSON under -out (bench/results/DATE.{md,json}).
//
// It starts everything it measures and stops it again, by pid: a private
// systemd (internal/dev/testenv), libvirtd and virtlogd in their own namespaces,
// and every QEMU. Run it as root through `make bench`, which installs the
// packages it needs (scripts/install-bench-deps.sh) and builds bin/vmsup, the
// CLI it measures. It is not part of `go test ./...`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmsup/vmsup/internal/dev/bench"
	"github.com/vmsup/vmsup/internal/dev/testenv"
	hostcaps "github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/units"
)

type config struct {
	out       string
	vmsupBin  string
	reps      int
	bootReps  int
	scale     []int
	scaleReps int
	scrape    []int
	memVMs    int
	qmpCalls  int
	migReps   int
	// migDiskReps: moves of each way in the migrate-disk section.
	migDiskReps int
	only        map[string]bool
	compare     string
}

func main() {
	var c config
	var scale, scrape, only string
	flag.StringVar(&c.out, "out", "bench/results", "directory for DATE.md and DATE.json")
	flag.StringVar(&c.vmsupBin, "vmsup", "bin/vmsup", "the vmsup CLI to measure (also the units' stop hook)")
	flag.IntVar(&c.reps, "reps", 10, "interleaved repetitions of start/stop and QMP rounds")
	flag.IntVar(&c.bootReps, "boot-reps", 10, "interleaved repetitions of the TCG boot to the console marker")
	flag.StringVar(&scale, "scale", "10,50,100", "VM counts brought up and down together")
	flag.StringVar(&scrape, "scrape", "10,100", "VM counts one metrics scrape reads")
	flag.IntVar(&c.scaleReps, "scale-reps", 3, "repetitions of each scale step")
	flag.IntVar(&c.memVMs, "mem-vms", 10, "VMs running while memory is measured")
	flag.IntVar(&c.qmpCalls, "qmp-calls", 200, "QMP calls per client per round")
	flag.IntVar(&c.migReps, "mig-reps", 5, "local migrations of each kind per guest size (at least 3)")
	flag.IntVar(&c.migDiskReps, "mig-disk-reps", 3, "moves of a VM with a 1 GiB local disk to another host, each way")
	flag.StringVar(&c.compare, "compare", "", "an earlier run's .json: its medians are shown beside this run's")
	flag.StringVar(&only, "only", "", "comma-separated sections to run (start,boot,memory,scale,qmp,scrape,snapshot,fleet,migrate,migrate-disk); default all")
	var fleetChildDir, fleetOut string
	flag.StringVar(&fleetChildDir, "fleet-child", "", "(internal) run the fleet section here, in this process's network namespace")
	flag.StringVar(&fleetOut, "fleet-out", "", "(internal) where the fleet child writes its rows")
	cpuProfile := flag.String("cpuprofile", "", "write the bench process's CPU profile (vmsup's Go API work) here")
	flag.Parse()
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "vmsup-bench:", err)
			os.Exit(1)
		}
		defer stop()
	}
	if fleetChildDir != "" {
		if err := fleetChild(fleetChildDir, c.vmsupBin, fleetOut); err != nil {
			fmt.Fprintln(os.Stderr, "vmsup-bench: fleet:", err)
			os.Exit(1)
		}
		return
	}
	for _, s := range strings.Split(scale, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && n > 0 {
			c.scale = append(c.scale, n)
		}
	}
	for _, s := range strings.Split(scrape, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && n > 0 {
			c.scrape = append(c.scrape, n)
		}
	}
	if only != "" {
		c.only = map[string]bool{}
		for _, s := range strings.Split(only, ",") {
			c.only[strings.TrimSpace(s)] = true
		}
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "vmsup-bench:", err)
		os.Exit(1)
	}
}

// startCPUProfile profiles this process into path until the returned stop.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// fixture is what every section shares.
type fixture struct {
	cfg     config
	dir     string // everything of this run: specs, state roots, libvirt
	blank   string // the idle VMs' blank read-only disk
	guest   guestFiles
	lvGuest guestFiles // copies of the guest that libvirt may relabel
	env     *testenv.Env
	sup     *supervisor.Supervisor // the API variant: one Supervisor, one D-Bus connection
	trace   *stepTrace
	// unitAfterJob: the bare unit's time from its start job's end to QMP
	// running, to set against vmsup's confirm step.
	unitAfterJob []time.Duration
	// rawCgroup is the cgroup.procs file raw QEMUs join: a sibling of the
	// sandbox's cgroup in the cpu hierarchy (testenv's BesideCgroup; inside
	// it the sandbox's systemd trims it), so that under load from other
	// processes raw and unit QEMUs get the same CPU share.
	rawCgroup string
	rawSup    *supervisor.Supervisor // only for argv, with its own root
	confSup   *supervisor.Supervisor // the same, for the confined unit
	sd        *units.Manager         // for the bare-unit variant
	lv        *libvirt
	vmsupBin  string
	cliEnv    []string
	// idle is kindIdle where the host probe says QEMU starts under KVM,
	// else kindIdleTCG: the start and stop figures use what this host has.
	idle   vmKind
	report *bench.Report

	mu  sync.Mutex
	raw map[*rawVM]bool // raw QEMUs still running, for clean-up
}

func run(c config) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: a systemd sandbox, libvirtd and QEMU with KVM")
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, 40*time.Minute)
	defer cancelT()
	began := time.Now()
	bin, err := filepath.Abs(c.vmsupBin)
	if err != nil {
		return err
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("vmsup CLI: %w (run make bench, which builds it)", err)
	}
	var prev *bench.Report
	if c.compare != "" { // read first: a bad path should not cost a sandbox start
		if prev, err = bench.Load(c.compare); err != nil {
			return err
		}
	}
	// Short and world-traversable: socket paths, and libvirt-qemu reads here.
	dir, err := os.MkdirTemp("/tmp", "vb-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	f := &fixture{cfg: c, dir: dir, vmsupBin: bin, report: &bench.Report{}, raw: map[*rawVM]bool{}, trace: &stepTrace{}}
	step("starting the systemd sandbox, building the test guest and probing the host")
	if f.env, err = testenv.Start(ctx, filepath.Join(dir, "env")); err != nil {
		return err
	}
	f.report.Machine = machine(f.env.Caps)
	f.report.Previous, f.report.PreviousName = prev, c.compare
	f.idle = kindIdleTCG
	if ok, _ := f.env.Caps.KVM.Starts(); ok {
		f.idle = kindIdle
	}
	fmt.Printf("vmsup-bench: %s, %d cores, KVM %s\n", f.report.Machine.QEMU, f.report.Machine.Cores, f.report.Machine.KVM)
	defer func() {
		if err := f.env.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "vmsup-bench: stop systemd sandbox:", err)
		}
	}()
	f.guest = guestFiles{f.env.Guest.Kernel, f.env.Guest.Initrd}
	cpuDir, err := f.env.Systemd.BesideCgroup("cpu")
	if err != nil {
		return fmt.Errorf("cgroup for raw QEMU: %w", err)
	}
	f.rawCgroup = filepath.Join(cpuDir, "cgroup.procs")
	if err := f.prepareFiles(); err != nil {
		return err
	}
	if f.sup, err = supervisor.New(supervisor.Options{
		Root: filepath.Join(dir, "root"), SystemdBus: f.env.Systemd.BusAddress, JournalDir: f.env.Systemd.JournalDir,
		Self: bin, AfterStep: f.trace.after, QEMU: f.env.QEMU, HostCaps: f.env.Caps, AllowPaths: f.env.AllowPaths, BlockDirs: f.env.BlockDirs,
	}); err != nil {
		return err
	}
	defer f.sup.Close()
	if f.rawSup, err = supervisor.New(supervisor.Options{Root: filepath.Join(dir, "raw"), Self: bin, QEMU: f.env.QEMU, HostCaps: f.env.Caps, AllowPaths: f.env.AllowPaths, BlockDirs: f.env.BlockDirs}); err != nil {
		return err
	}
	if f.confSup, err = supervisor.New(supervisor.Options{Root: filepath.Join(dir, "conf"), Self: bin, QEMU: f.env.QEMU, HostCaps: f.env.Caps, AllowPaths: f.env.AllowPaths, BlockDirs: f.env.BlockDirs}); err != nil {
		return err
	}
	if f.sd, err = units.Connect(ctx, f.env.Systemd.BusAddress); err != nil {
		return err
	}
	defer f.sd.Close()
	f.cliEnv = append(os.Environ(), "VMSUP_ROOT="+filepath.Join(dir, "cliroot"),
		"VMSUP_SYSTEMD_BUS="+f.env.Systemd.BusAddress, "VMSUP_JOURNAL_DIR="+f.env.Systemd.JournalDir)
	f.cliEnv = append(f.cliEnv, f.env.CLIEnv()...)

	step("starting libvirtd and virtlogd")
	if f.lv, err = startLibvirt(ctx, filepath.Join(dir, "lv")); err != nil {
		return err
	}
	_, f.lv.cpuMasks, _ = f.env.Caps.CPU("kvm", "")
	defer func() {
		if err := f.lv.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "vmsup-bench:", err)
		}
	}()
	if err := f.copyGuestForLibvirt(); err != nil {
		return err
	}
	defer f.cleanup()

	return f.runSections(ctx, began)
}

// runSections runs the chosen sections, keeping what is measured so far,
// then writes and prints the report.
func (f *fixture) runSections(ctx context.Context, began time.Time) error {
	c := f.cfg
	sections := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"start", f.startStop},
		{"boot", f.boot},
		{"memory", f.memory},
		{"scale", f.scale},
		{"qmp", f.qmpLatency},
		{"scrape", f.scrape},
		{"snapshot", f.snapshots},
		{"fleet", f.fleetSection},
		{"migrate", f.migrateLocal},
		{"migrate-disk", f.migrateDisk},
	}
	name := time.Now().UTC().Format("2006-01-02T1504Z")
	for _, s := range sections {
		if c.only != nil && !c.only[s.name] {
			continue
		}
		if err := s.fn(ctx); err != nil {
			f.cleanup()
			return fmt.Errorf("%s: %w", s.name, err)
		}
		f.cleanup()
		// Keep what is measured so far if a later section fails.
		f.report.Resolve()
		if _, _, err := f.report.Write(c.out, name+".partial"); err != nil {
			return err
		}
	}
	os.Remove(filepath.Join(c.out, name+".partial.md"))
	os.Remove(filepath.Join(c.out, name+".partial.json"))
	f.report.Note("Variants run interleaved, order rotated each repetition. vmsup and the bare unit run QEMU in the sandbox systemd's vmsup.slice; raw QEMU runs in a cgroup beside it (same CPU share); libvirt puts its QEMUs in its own machine cgroup.")
	f.report.Note("Idle VMs: no guest OS (SeaBIOS, a blank read-only disk), q35, 1 vCPU; for one VM at a time (sections 1-2) KVM where the host probe says QEMU starts under it, else TCG (the accel column says which); TCG where many run at once or for long (4-6): an idle VM spins ~60%% of a core under PVM KVM and ~1%% under TCG; the libvirt domain is the same machine (no USB, no balloon, serial on a unix socket with a log). Boot: the test guest (uncompressed kernel + busybox initramfs) under TCG.")
	f.report.Note("vmsup Go API: one Supervisor (one D-Bus connection) in the bench process, spec.Load + Up per start. vmsup CLI: a bin/vmsup process per command, as a user runs it. virsh: a virsh process per command; libvirt API: one go-libvirt connection.")
	f.report.Resolve()
	f.report.Took = time.Since(began).Round(time.Second).String()
	md, js, err := f.report.Write(c.out, name)
	if err != nil {
		return err
	}
	fmt.Println()
	fmt.Print(f.report.Markdown())
	fmt.Printf("\nwrote %s and %s\n", md, js)
	if broken := f.report.BrokenBaselines(); len(broken) > 0 {
		return fmt.Errorf("a baseline failed, the figures against it mean nothing: %s", strings.Join(broken, "; "))
	}
	return nil
}

func step(msg string) { fmt.Printf("[%s] %s\n", time.Now().Format("15:04:05"), msg) }

// prepareFiles makes the blank disk of the idle VMs.
func (f *fixture) prepareFiles() error {
	f.blank = filepath.Join(f.dir, "blank.img")
	fh, err := os.Create(f.blank)
	if err != nil {
		return err
	}
	defer fh.Close()
	return fh.Truncate(1 << 20)
}

// copyGuestForLibvirt copies the guest kernel and initrd where libvirt's
// DAC driver may chown them for libvirt-qemu without touching the shared
// cache other users of the test guest read.
func (f *fixture) copyGuestForLibvirt() error {
	f.lvGuest = guestFiles{filepath.Join(f.lv.dir, "vmlinux"), filepath.Join(f.lv.dir, "initramfs.cpio.gz")}
	for src, dst := range map[string]string{f.guest.kernel: f.lvGuest.kernel, f.guest.initrd: f.lvGuest.initrd} {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (f *fixture) trackRaw(v *rawVM, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on {
		f.raw[v] = true
	} else {
		delete(f.raw, v)
	}
}

// cleanup ends whatever a section left running: raw QEMUs (by their pid),
// vmsup VMs of both roots (kill their units), bare units, libvirt domains.
func (f *fixture) cleanup() {
	f.mu.Lock()
	raws := make([]*rawVM, 0, len(f.raw))
	for v := range f.raw {
		raws = append(raws, v)
	}
	f.raw = map[*rawVM]bool{}
	f.mu.Unlock()
	for _, v := range raws {
		v.kill()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if us, err := f.sd.List(ctx, "*.service"); err == nil {
		for _, u := range us {
			if strings.HasPrefix(u.Name, "vmsup-") || strings.HasPrefix(u.Name, "bench-") {
				_ = f.sd.Kill(ctx, u.Name, syscall.SIGKILL)
				for i := 0; i < 200; i++ {
					st, err := f.sd.Status(ctx, u.Name)
					if err != nil || !st.Exists || st.ActiveState == "inactive" || st.ActiveState == "failed" {
						break
					}
					time.Sleep(10 * time.Millisecond)
				}
				_ = f.sd.ResetFailed(ctx, u.Name)
			}
		}
	}
	if f.lv != nil && f.lv.conn != nil {
		if doms, _, err := f.lv.conn.ConnectListAllDomains(1, 0); err == nil {
			for _, d := range doms {
				_ = f.lv.conn.DomainDestroy(d)
			}
		}
	}
}

// stepTrace records how long each step of vmsup's Up took, for the
// breakdown of where start-up time goes (Options.AfterStep).
type stepTrace struct {
	mu    sync.Mutex
	on    bool
	last  time.Time
	steps map[string][]time.Duration
	order []string
}

func (t *stepTrace) begin() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.on, t.last = true, time.Now()
}

func (t *stepTrace) end() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.on = false
}

func (t *stepTrace) after(_, step string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.on {
		return
	}
	now := time.Now()
	if t.steps == nil {
		t.steps = map[string][]time.Duration{}
	}
	if _, ok := t.steps[step]; !ok {
		t.order = append(t.order, step)
	}
	t.steps[step] = append(t.steps[step], now.Sub(t.last))
	t.last = now
}

// machine records cores, CPU, memory, kernel, KVM kind and versions.
func machine(caps *supervisor.HostCaps) bench.Machine {
	m := bench.Machine{Date: time.Now().UTC().Format(time.RFC3339), Cores: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				m.CPU = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	h := supervisor.ProbeHost()
	m.MemMiB = h.MemTotal >> 20
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		m.Kernel = cstr(u.Release[:])
	}
	starts, why := caps.KVM.Starts()
	_, masks, _ := caps.CPU("kvm", "")
	switch {
	case !starts:
		m.KVM = "none (" + why + "): start and stop figures under TCG"
	case caps.KVM.Kind != hostcaps.KVMFull:
		m.KVM = "yes, but " + caps.KVM.Reason + ": QEMU starts with it, the test guest boots only under TCG"
	default:
		m.KVM = "yes"
	}
	if starts && len(masks) > 0 {
		m.KVM += "; -cpu host needs " + strings.Join(masks, ", ") + " off"
	}
	m.QEMU = firstLine("qemu-system-x86_64", "--version")
	m.Systemd = strings.TrimPrefix(firstLine("systemctl", "--version"), "systemd ")
	m.Libvirt = strings.TrimPrefix(firstLine("libvirtd", "--version"), "libvirtd (libvirt) ")
	return m
}

func cstr(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

func firstLine(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return name + ": " + err.Error()
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
}
