package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmsup/vmsup/internal/dev/bench"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// fleet is n idle VMs of one variant, brought up and down together.
type fleet struct {
	name     string
	up, down func(ctx context.Context) (failed int, err error)
	names    []string
}

// fleets returns the variants of section 5 for n idle TCG VMs of memMiB
// each; tag keeps VM names apart between sections. The order is fixed:
// vmsup (one call), vmsup (concurrent), raw QEMU, libvirt.
func (f *fixture) fleets(n, memMiB int, tag string) ([]fleet, error) {
	specDir := filepath.Join(f.dir, "specs")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		return nil, err
	}
	var out []fleet
	for _, v := range []struct {
		prefix string
		make   func(names, paths []string) fleet
	}{
		{"s", f.vmsupOneCall}, {"c", f.vmsupConcurrent}, {"r", f.rawFleet},
		{"l", func(names, _ []string) fleet { return f.libvirtFleet(names, memMiB) }},
	} {
		var names, paths []string
		for i := 0; i < n; i++ {
			name := fmt.Sprintf("%s%s%d", tag, v.prefix, i)
			p, err := specFile(specDir, name, kindIdleTCG, memMiB, f.blank, f.guest)
			if err != nil {
				return nil, err
			}
			names, paths = append(names, name), append(paths, p)
		}
		out = append(out, v.make(names, paths))
	}
	return out, nil
}

// vmsupOneCall: all files in one Up call (what `vmsup up *.toml` does).
func (f *fixture) vmsupOneCall(names, paths []string) fleet {
	n := len(names)
	return fleet{name: vmsupUp + "(all files, one call)", names: names,
		up: func(ctx context.Context) (int, error) {
			fs, err := loadAll(paths)
			if err != nil {
				return n, err
			}
			res, err := f.sup.Up(ctx, fs...)
			return n - len(res), err
		},
		down: func(ctx context.Context) (int, error) { return f.downAll(ctx, names) }}
}

// vmsupConcurrent: one Up per VM, all at once, on one Supervisor.
func (f *fixture) vmsupConcurrent(names, paths []string) fleet {
	n := len(names)
	return fleet{name: vmsupUp + " x N, concurrent", names: names,
		up: func(ctx context.Context) (int, error) {
			fs, err := loadAll(paths)
			if err != nil {
				return n, err
			}
			return parallel(n, func(i int) error { _, err := f.sup.Up(ctx, fs[i]); return err })
		},
		down: func(ctx context.Context) (int, error) { return f.downAll(ctx, names) }}
}

// rawFleet: every exec at once, each polled until QMP answers.
func (f *fixture) rawFleet(names, paths []string) fleet {
	n := len(names)
	raws := make([]*rawVM, n)
	return fleet{name: vRaw + ", concurrent", names: names,
		up: func(ctx context.Context) (int, error) {
			plans := make([]rawPlan, n)
			for i, p := range paths {
				var err error
				if plans[i], err = rawArgv(f.rawSup, p); err != nil {
					return n, err
				}
			}
			return parallel(n, func(i int) error {
				v, err := startRaw(names[i], plans[i], f.rawCgroup)
				if err != nil {
					return err
				}
				raws[i] = v
				f.trackRaw(v, true)
				return v.waitRunning(ctx)
			})
		},
		down: func(ctx context.Context) (int, error) {
			return parallel(n, func(i int) error {
				if raws[i] == nil {
					return fmt.Errorf("raw %s never started", names[i])
				}
				defer f.trackRaw(raws[i], false)
				return raws[i].quit(ctx)
			})
		}}
}

// libvirtFleet: DomainCreateXML for every VM at once on one connection.
func (f *fixture) libvirtFleet(names []string, memMiB int) fleet {
	n := len(names)
	return fleet{name: vLvAPI + ", concurrent", names: names,
		up: func(ctx context.Context) (int, error) {
			return parallel(n, func(i int) error {
				_, err := f.lv.create(f.lv.domainXML(names[i], kindIdleTCG, memMiB, f.blank, f.lvGuest))
				return err
			})
		},
		down: func(ctx context.Context) (int, error) {
			return parallel(n, func(i int) error { return f.lv.destroy(names[i]) })
		}}
}

func loadAll(paths []string) ([]*spec.File, error) {
	fs := make([]*spec.File, len(paths))
	for i, p := range paths {
		var err error
		if fs[i], err = spec.Load(p); err != nil {
			return nil, err
		}
	}
	return fs, nil
}

// parallel runs fn(0..n-1) at once and returns how many failed and the
// first error.
func parallel(n int, fn func(i int) error) (int, error) {
	var (
		wg     sync.WaitGroup
		failed atomic.Int64
		once   sync.Once
		first  error
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(i); err != nil {
				failed.Add(1)
				once.Do(func() { first = err })
			}
		}()
	}
	wg.Wait()
	return int(failed.Load()), first
}

// downAll runs vmsup's Down for every VM at once.
func (f *fixture) downAll(ctx context.Context, names []string) (int, error) {
	return parallel(len(names), func(i int) error { _, err := f.sup.Down(ctx, names[i]); return err })
}

// scale is section 5.
func (f *fixture) scale(ctx context.Context) error {
	const sec = "5. scale (idle VMs, no guest OS, TCG, 64 MiB each, brought up and down together)"
	for _, n := range f.cfg.scale {
		fl, err := f.fleets(n, 64, "x"+strconv.Itoa(n))
		if err != nil {
			return err
		}
		up := make([][]float64, len(fl))
		down := make([][]float64, len(fl))
		perVM := make([][]float64, len(fl))
		upCPU := make([][]cpuSample, len(fl))
		downCPU := make([][]cpuSample, len(fl))
		upFail := make([]int, len(fl))
		downFail := make([]int, len(fl))
		firstErr := make([]string, len(fl))
		for r := 0; r < f.cfg.scaleReps; r++ {
			for j := range fl {
				if err := ctx.Err(); err != nil {
					return err
				}
				i := (j + r) % len(fl)
				v := fl[i]
				step(fmt.Sprintf("scale %d: %s, repetition %d of %d", n, v.name, r+1, f.cfg.scaleReps))
				uctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
				pid1 := f.env.Systemd.PID1
				c0, t0 := sampleCPU(pid1), time.Now()
				failed, err := v.up(uctx)
				d := time.Since(t0)
				upCPU[i] = append(upCPU[i], c0.perVM(sampleCPU(pid1), n))
				cancel()
				upFail[i] += failed
				if err != nil && firstErr[i] == "" {
					firstErr[i] = "up: " + err.Error()
				}
				if err == nil {
					up[i] = append(up[i], d.Seconds())
					perVM[i] = append(perVM[i], float64(d.Milliseconds())/float64(n))
				}
				time.Sleep(500 * time.Millisecond)
				dctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
				c0, t0 = sampleCPU(pid1), time.Now()
				failed, err = v.down(dctx)
				d = time.Since(t0)
				downCPU[i] = append(downCPU[i], c0.perVM(sampleCPU(pid1), n))
				cancel()
				downFail[i] += failed
				if err != nil && firstErr[i] == "" {
					firstErr[i] = "down: " + err.Error()
				}
				if err == nil {
					down[i] = append(down[i], d.Seconds())
				}
				f.cleanup()
				time.Sleep(500 * time.Millisecond)
			}
		}
		for _, fig := range []struct {
			name string
			unit string
			vals [][]float64
			fail []int
		}{
			{fmt.Sprintf("up %d VMs, wall", n), "s", up, upFail},
			{fmt.Sprintf("up %d VMs, per VM", n), "ms", perVM, upFail},
			{fmt.Sprintf("down %d VMs, wall", n), "s", down, downFail},
		} {
			for i, v := range fl {
				row := bench.Row{Section: sec, Figure: fig.name, Variant: v.name, Accel: "tcg", Unit: fig.unit,
					Summary: bench.Summarize(fig.vals[i]), Failures: fig.fail[i]}
				if i != 2 { // raw QEMU is the baseline
					row.Baseline = fl[2].name
				}
				if fig.fail[i] > 0 {
					row.Note = strings.ReplaceAll(firstErr[i], "|", "/")
				}
				f.report.Add(row)
			}
		}
		f.cpuRows(sec, n, fl, upCPU, downCPU)
	}
	f.report.Note("Scale CPU rows: the host's busy CPU time (all processes: QEMU, systemd, vmsup, libvirtd) and the sandbox systemd's (PID 1 of vmsup's and the bare units) during each up or down, divided by the VMs; /proc's 10 ms ticks.")
	f.report.Note("Scale rows are over %d repetitions each (not 10) to keep the run under 15 minutes; failures count VMs.", f.cfg.scaleReps)
	return nil
}

// memory is section 4: what stays resident while N idle VMs run.
func (f *fixture) memory(ctx context.Context) error {
	n := f.cfg.memVMs
	var m memFigures
	time.Sleep(time.Second)
	m.sdIdle = f.sandboxRSS()
	m.lvdIdle, m.vlIdle = f.lv.daemonRSS()
	fl, err := f.fleets(n, 128, "m")
	if err != nil {
		return err
	}
	vmsupF, rawF, lvF := fl[0], fl[2], fl[3]
	step(fmt.Sprintf("memory: %d VMs through vmsup", n))
	err = f.resident(ctx, vmsupF, func() {
		m.vmsupProcs = vmsupProcs()
		m.sdWith = f.sandboxRSS()
		m.vmsupRSS = qemuRSS(vmsupF.names)
		m.cgroup = f.cgroupMemory(vmsupF.names)
	})
	if err != nil {
		return err
	}
	step(fmt.Sprintf("memory: %d raw QEMUs", n))
	if err := f.resident(ctx, rawF, func() { m.rawRSS = qemuRSS(rawF.names) }); err != nil {
		return err
	}
	step(fmt.Sprintf("memory: %d libvirt domains", n))
	err = f.resident(ctx, lvF, func() {
		m.lvdWith, m.vlWith = f.lv.daemonRSS()
		m.lvRSS = qemuRSS(lvF.names)
	})
	if err != nil {
		return err
	}
	f.reportMemory(n, m)
	return nil
}

// memFigures are section 4's measurements (bytes; per-VM lists in MiB).
type memFigures struct {
	sdIdle, sdWith, lvdIdle, vlIdle, lvdWith, vlWith int64
	vmsupProcs                                       int
	vmsupRSS, rawRSS, lvRSS, cgroup                  []float64
}

// resident brings fl up, lets it settle, measures, and brings it down.
func (f *fixture) resident(ctx context.Context, fl fleet, measure func()) error {
	if _, err := fl.up(ctx); err != nil {
		return err
	}
	// Past the console loggers' idle time (internal/lifecycle/companion): an idle
	// VM's SeaBIOS lines start one, which ends 3 s after.
	time.Sleep(4 * time.Second)
	measure()
	_, err := fl.down(ctx)
	return err
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// sandboxRSS is the sandbox systemd's resident memory, QEMUs left out.
func (f *fixture) sandboxRSS() int64 {
	var sum int64
	for _, p := range descendants(listProcs(), f.env.Systemd.PID1) {
		if !strings.HasPrefix(p.comm, "qemu-system") {
			sum += rssOf(p.pid)
		}
	}
	return sum
}

// qemuRSS is the resident memory of each named VM's QEMU.
func qemuRSS(names []string) []float64 {
	procs := listProcs()
	var out []float64
	for _, nm := range names {
		if pid := qemuPID(procs, nm); pid > 0 {
			out = append(out, mib(rssOf(pid)))
		}
	}
	return out
}

// vmsupProcs counts the vmsup processes alive.
func vmsupProcs() int {
	n := 0
	for _, p := range listProcs() {
		if p.comm == "vmsup" || filepath.Base(p.cmdline[0]) == "vmsup" {
			n++
		}
	}
	return n
}

// cgroupMemory is each VM unit's cgroup memory charge.
func (f *fixture) cgroupMemory(names []string) []float64 {
	var out []float64
	for _, nm := range names {
		d, err := f.env.Systemd.CgroupDir("memory", vmstore.UnitName(nm))
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(d, "memory.usage_in_bytes")); err == nil {
			v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			out = append(out, mib(v))
		}
	}
	return out
}

func (f *fixture) reportMemory(n int, m memFigures) {
	const sec = "4. memory (idle VMs, no guest OS, TCG, 128 MiB each)"
	r := f.report
	one := func(v float64) bench.Summary { return bench.Summarize([]float64{v}) }
	nVMs := fmt.Sprintf("with %d VMs", n)
	r.Add(bench.Row{Section: sec, Figure: "vmsup processes " + nVMs, Variant: "vmsup", Accel: "tcg", Unit: "count",
		Summary: one(float64(m.vmsupProcs)), Note: "target 0: vmsup has no daemon; QEMU runs in systemd units"})
	r.Add(bench.Row{Section: sec, Figure: "manager RSS, idle", Variant: "systemd (PID 1 + journald + dbus)", Accel: "-", Unit: "MiB", Summary: one(mib(m.sdIdle)),
		Note: "needed anyway on a systemd host"})
	r.Add(bench.Row{Section: sec, Figure: "manager RSS, idle", Variant: "libvirtd + virtlogd", Accel: "-", Unit: "MiB", Summary: one(mib(m.lvdIdle + m.vlIdle)),
		Note: fmt.Sprintf("libvirtd %.1f + virtlogd %.1f", mib(m.lvdIdle), mib(m.vlIdle))})
	r.Add(bench.Row{Section: sec, Figure: "manager RSS growth " + nVMs, Variant: "systemd (PID 1 + journald + dbus)", Accel: "tcg", Unit: "MiB",
		Summary: one(mib(m.sdWith - m.sdIdle)), Note: fmt.Sprintf("%.1f -> %.1f MiB", mib(m.sdIdle), mib(m.sdWith))})
	r.Add(bench.Row{Section: sec, Figure: "manager RSS growth " + nVMs, Variant: "libvirtd + virtlogd", Accel: "tcg", Unit: "MiB",
		Summary: one(mib(m.lvdWith + m.vlWith - m.lvdIdle - m.vlIdle)), Note: fmt.Sprintf("libvirtd %.1f, virtlogd %.1f MiB with %d domains", mib(m.lvdWith), mib(m.vlWith), n)})
	r.Add(bench.Row{Section: sec, Figure: "host memory per VM beyond QEMU", Variant: "vmsup (systemd's growth + companions)", Accel: "tcg", Unit: "MiB",
		Summary: one(mib(m.sdWith-m.sdIdle) / float64(max(n, 1))), Limit: 1,
		Note: fmt.Sprintf("the RSS growth of the sandbox's systemd, journald, dbus and every companion process (console loggers) with %d idle VMs, per VM", n)})
	r.Add(bench.Row{Section: sec, Figure: "QEMU RSS per VM", Variant: vRaw, Accel: "tcg", Unit: "MiB", Summary: bench.Summarize(m.rawRSS)})
	r.Add(bench.Row{Section: sec, Figure: "QEMU RSS per VM", Variant: "vmsup (QEMU in its unit)", Accel: "tcg", Unit: "MiB",
		Summary: bench.Summarize(m.vmsupRSS), Baseline: vRaw})
	r.Add(bench.Row{Section: sec, Figure: "QEMU RSS per VM", Variant: "libvirt", Accel: "tcg", Unit: "MiB",
		Summary: bench.Summarize(m.lvRSS), Baseline: vRaw})
	r.Add(bench.Row{Section: sec, Figure: "unit cgroup memory per VM", Variant: "vmsup (memory.usage_in_bytes)", Accel: "tcg", Unit: "MiB",
		Summary: bench.Summarize(m.cgroup), Note: "cgroup v1 charge: QEMU's RSS plus page cache it touched"})
}

// cpuRows adds the CPU per VM of each variant's up and down.
func (f *fixture) cpuRows(sec string, n int, fl []fleet, upCPU, downCPU [][]cpuSample) {
	for _, c := range []struct {
		what string
		s    [][]cpuSample
	}{{"up", upCPU}, {"down", downCPU}} {
		for i, v := range fl {
			var host, pid1 []float64
			for _, x := range c.s[i] {
				host, pid1 = append(host, x.host), append(pid1, x.pid1)
			}
			f.report.Add(bench.Row{Section: sec, Figure: fmt.Sprintf("%s %d VMs, host CPU per VM", c.what, n), Variant: v.name,
				Accel: "tcg", Unit: "ms", Summary: bench.Summarize(host)})
			if i < 2 { // only vmsup's units run under the sandbox's systemd
				f.report.Add(bench.Row{Section: sec, Figure: fmt.Sprintf("%s %d VMs, systemd (PID 1) CPU per VM", c.what, n), Variant: v.name,
					Accel: "tcg", Unit: "ms", Summary: bench.Summarize(pid1)})
			}
		}
	}
}
