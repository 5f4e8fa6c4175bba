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

	"github.com/vmsup/vmsup/internal/bench"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/spec"
)

// fleet is n idle VMs of one variant, brought up and down together.
type fleet struct {
	name     string
	up, down func(ctx context.Context) (failed int, err error)
	names    []string
}

// fleets returns the variants of section 5 for n idle TCG VMs of memMiB
// each; tag keeps VM names apart between sections.
func (f *fixture) fleets(n, memMiB int, tag string) ([]fleet, error) {
	const k = kindIdleTCG
	specDir := filepath.Join(f.dir, "specs")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		return nil, err
	}
	mk := func(prefix string) ([]string, []string, error) {
		var names, paths []string
		for i := 0; i < n; i++ {
			name := fmt.Sprintf("%s%s%d", tag, prefix, i)
			p, err := specFile(specDir, name, k, memMiB, f.blank, f.guest)
			if err != nil {
				return nil, nil, err
			}
			names, paths = append(names, name), append(paths, p)
		}
		return names, paths, nil
	}
	var out []fleet

	// vmsup: all files in one Up call (what `vmsup up *.toml` does).
	seqNames, seqPaths, err := mk("s")
	if err != nil {
		return nil, err
	}
	out = append(out, fleet{name: vmsupUp + "(all files, one call)", names: seqNames,
		up: func(ctx context.Context) (int, error) {
			fs, err := loadAll(seqPaths)
			if err != nil {
				return n, err
			}
			res, err := f.sup.Up(ctx, fs...)
			return n - len(res), err
		},
		down: func(ctx context.Context) (int, error) { return f.downAll(ctx, seqNames) }})

	// vmsup: one Up per VM, all at once, on one Supervisor.
	conNames, conPaths, err := mk("c")
	if err != nil {
		return nil, err
	}
	out = append(out, fleet{name: vmsupUp + " x N, concurrent", names: conNames,
		up: func(ctx context.Context) (int, error) {
			fs, err := loadAll(conPaths)
			if err != nil {
				return n, err
			}
			return parallel(n, func(i int) error { _, err := f.sup.Up(ctx, fs[i]); return err })
		},
		down: func(ctx context.Context) (int, error) { return f.downAll(ctx, conNames) }})

	// raw QEMU: every exec at once, each polled until QMP answers.
	rawNames, rawPaths, err := mk("r")
	if err != nil {
		return nil, err
	}
	raws := make([]*rawVM, n)
	out = append(out, fleet{name: vRaw + ", concurrent", names: rawNames,
		up: func(ctx context.Context) (int, error) {
			argvs := make([][]string, n)
			dirs := make([]string, n)
			for i, p := range rawPaths {
				var err error
				if argvs[i], dirs[i], err = rawArgv(f.rawSup, p); err != nil {
					return n, err
				}
			}
			return parallel(n, func(i int) error {
				v, err := startRaw(rawNames[i], argvs[i], dirs[i], f.rawCgroup)
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
					return fmt.Errorf("raw %s never started", rawNames[i])
				}
				defer f.trackRaw(raws[i], false)
				return raws[i].quit(ctx)
			})
		}})

	// libvirt: DomainCreateXML for every VM at once on one connection.
	lvNames, _, err := mk("l")
	if err != nil {
		return nil, err
	}
	out = append(out, fleet{name: vLvAPI + ", concurrent", names: lvNames,
		up: func(ctx context.Context) (int, error) {
			return parallel(n, func(i int) error {
				_, err := f.lv.create(f.lv.domainXML(lvNames[i], k, memMiB, f.blank, f.lvGuest))
				return err
			})
		},
		down: func(ctx context.Context) (int, error) {
			return parallel(n, func(i int) error { return f.lv.destroy(lvNames[i]) })
		}})
	return out, nil
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
				t0 := time.Now()
				failed, err := v.up(uctx)
				d := time.Since(t0)
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
				t0 = time.Now()
				failed, err = v.down(dctx)
				d = time.Since(t0)
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
	}
	f.report.Note("Scale rows are over %d repetitions each (not 10) to keep the run under 15 minutes; failures count VMs.", f.cfg.scaleReps)
	return nil
}

// memory is section 4: what stays resident while N idle VMs run.
func (f *fixture) memory(ctx context.Context) error {
	const sec = "4. memory (idle VMs, no guest OS, TCG, 128 MiB each)"
	n := f.cfg.memVMs
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	sandboxRSS := func() int64 {
		var sum int64
		for _, p := range descendants(listProcs(), f.env.Systemd.PID1) {
			if !strings.HasPrefix(p.comm, "qemu-system") {
				sum += rssOf(p.pid)
			}
		}
		return sum
	}
	time.Sleep(time.Second)
	sdIdle := sandboxRSS()
	lvdIdle, vlIdle := f.lv.daemonRSS()

	fl, err := f.fleets(n, 128, "m")
	if err != nil {
		return err
	}
	vmsupF, rawF, lvF := fl[0], fl[2], fl[3]
	qemuRSS := func(names []string) []float64 {
		procs := listProcs()
		var out []float64
		for _, nm := range names {
			if pid := qemuPID(procs, nm); pid > 0 {
				out = append(out, mib(rssOf(pid)))
			}
		}
		return out
	}

	// vmsup
	step(fmt.Sprintf("memory: %d VMs through vmsup", n))
	if _, err := vmsupF.up(ctx); err != nil {
		return err
	}
	time.Sleep(2 * time.Second)
	vmsupProcs := 0
	for _, p := range listProcs() {
		if p.comm == "vmsup" || filepath.Base(p.cmdline[0]) == "vmsup" {
			vmsupProcs++
		}
	}
	sdWith := sandboxRSS()
	vmsupRSS := qemuRSS(vmsupF.names)
	var cgroup []float64
	for _, nm := range vmsupF.names {
		d, err := f.env.Systemd.CgroupDir("memory", vmstate.UnitName(nm))
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(d, "memory.usage_in_bytes")); err == nil {
			v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			cgroup = append(cgroup, mib(v))
		}
	}
	if _, err := vmsupF.down(ctx); err != nil {
		return err
	}

	// raw
	step(fmt.Sprintf("memory: %d raw QEMUs", n))
	if _, err := rawF.up(ctx); err != nil {
		return err
	}
	time.Sleep(2 * time.Second)
	rawRSS := qemuRSS(rawF.names)
	if _, err := rawF.down(ctx); err != nil {
		return err
	}

	// libvirt
	step(fmt.Sprintf("memory: %d libvirt domains", n))
	if _, err := lvF.up(ctx); err != nil {
		return err
	}
	time.Sleep(2 * time.Second)
	lvdWith, vlWith := f.lv.daemonRSS()
	lvRSS := qemuRSS(lvF.names)
	if _, err := lvF.down(ctx); err != nil {
		return err
	}

	r := f.report
	one := func(v float64) bench.Summary { return bench.Summarize([]float64{v}) }
	nVMs := fmt.Sprintf("with %d VMs", n)
	r.Add(bench.Row{Section: sec, Figure: "vmsup processes " + nVMs, Variant: "vmsup", Accel: "tcg", Unit: "count",
		Summary: one(float64(vmsupProcs)), Note: "target 0: vmsup has no daemon; QEMU runs in systemd units"})
	r.Add(bench.Row{Section: sec, Figure: "manager RSS, idle", Variant: "systemd (PID 1 + journald + dbus)", Accel: "-", Unit: "MiB", Summary: one(mib(sdIdle)),
		Note: "needed anyway on a systemd host"})
	r.Add(bench.Row{Section: sec, Figure: "manager RSS, idle", Variant: "libvirtd + virtlogd", Accel: "-", Unit: "MiB", Summary: one(mib(lvdIdle + vlIdle)),
		Note: fmt.Sprintf("libvirtd %.1f + virtlogd %.1f", mib(lvdIdle), mib(vlIdle))})
	r.Add(bench.Row{Section: sec, Figure: "manager RSS growth " + nVMs, Variant: "systemd (PID 1 + journald + dbus)", Accel: "tcg", Unit: "MiB",
		Summary: one(mib(sdWith - sdIdle)), Note: fmt.Sprintf("%.1f -> %.1f MiB", mib(sdIdle), mib(sdWith))})
	r.Add(bench.Row{Section: sec, Figure: "manager RSS growth " + nVMs, Variant: "libvirtd + virtlogd", Accel: "tcg", Unit: "MiB",
		Summary: one(mib(lvdWith + vlWith - lvdIdle - vlIdle)), Note: fmt.Sprintf("libvirtd %.1f, virtlogd %.1f MiB with %d domains", mib(lvdWith), mib(vlWith), n)})
	r.Add(bench.Row{Section: sec, Figure: "QEMU RSS per VM", Variant: vRaw, Accel: "tcg", Unit: "MiB", Summary: bench.Summarize(rawRSS)})
	r.Add(bench.Row{Section: sec, Figure: "QEMU RSS per VM", Variant: "vmsup (QEMU in its unit)", Accel: "tcg", Unit: "MiB",
		Summary: bench.Summarize(vmsupRSS), Baseline: vRaw})
	r.Add(bench.Row{Section: sec, Figure: "QEMU RSS per VM", Variant: "libvirt", Accel: "tcg", Unit: "MiB",
		Summary: bench.Summarize(lvRSS), Baseline: vRaw})
	r.Add(bench.Row{Section: sec, Figure: "unit cgroup memory per VM", Variant: "vmsup (memory.usage_in_bytes)", Accel: "tcg", Unit: "MiB",
		Summary: bench.Summarize(cgroup), Note: "cgroup v1 charge: QEMU's RSS plus page cache it touched"})
	return nil
}
