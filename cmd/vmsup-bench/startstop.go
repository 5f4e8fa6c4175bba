package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/dev/bench"
	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/internal/host/posixacl"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/units"
)

// variant is one way of starting and stopping one VM.
type variant struct {
	name, accel string
	start, stop func(ctx context.Context) error
	prep        func() error // before each start, not timed
}

type samples struct {
	start, stop         []time.Duration
	startFail, stopFail int
	errs                []string
}

// interleave runs each variant's start then stop once per repetition,
// rotating the order every repetition so no variant always runs first.
func (f *fixture) interleave(ctx context.Context, what string, reps int, vs []variant, timeout time.Duration) (map[string]*samples, error) {
	out := map[string]*samples{}
	for _, v := range vs {
		out[v.name] = &samples{}
	}
	for r := 0; r < reps; r++ {
		step(fmt.Sprintf("%s: repetition %d of %d", what, r+1, reps))
		for i := range vs {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			v := vs[(i+r)%len(vs)]
			s := out[v.name]
			var err error
			if v.prep != nil {
				err = v.prep()
			}
			sctx, cancel := context.WithTimeout(ctx, timeout)
			t0 := time.Now()
			if err == nil {
				err = v.start(sctx)
			}
			d := time.Since(t0)
			cancel()
			if err != nil {
				s.startFail++
				s.errs = append(s.errs, "start: "+err.Error())
				fmt.Printf("  %s: start failed: %v\n", v.name, err)
				f.cleanup()
				continue
			}
			s.start = append(s.start, d)
			time.Sleep(100 * time.Millisecond)
			sctx, cancel = context.WithTimeout(ctx, timeout)
			t0 = time.Now()
			err = v.stop(sctx)
			d = time.Since(t0)
			cancel()
			if err != nil {
				s.stopFail++
				s.errs = append(s.errs, "stop: "+err.Error())
				fmt.Printf("  %s: stop failed: %v\n", v.name, err)
				f.cleanup()
			} else {
				s.stop = append(s.stop, d)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return out, nil
}

func (s *samples) note() string {
	if len(s.errs) == 0 {
		return ""
	}
	return "first failure: " + strings.ReplaceAll(s.errs[0], "|", "/")
}

// runCLI runs the vmsup CLI against the sandbox.
func (f *fixture) runCLI(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, f.vmsupBin, args...)
	cmd.Env = f.cliEnv
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("vmsup %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Variant names used across sections.
const (
	vRaw    = "raw QEMU"
	vUnit   = "systemd unit, no vmsup"
	vConf   = "confined unit, no vmsup"
	vAPI    = "vmsup Go API"
	vCLI    = "vmsup CLI"
	vVirsh  = "virsh"
	vLvAPI  = "libvirt API, 1 conn"
	vmsupUp = "vmsup Up"
)

// variants returns the start/stop variants for one VM of kind k, each with
// its own VM name (prefix + short tag).
func (f *fixture) variants(k vmKind, memMiB int, prefix string, withUnit, withLvAPI bool) ([]variant, error) {
	specDir := filepath.Join(f.dir, "specs")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		return nil, err
	}
	g := f.guest
	accel := k.accel()
	var vs []variant

	// raw QEMU, vmsup's own argv.
	rawPath, err := specFile(specDir, prefix+"raw", k, memMiB, f.blank, g)
	if err != nil {
		return nil, err
	}
	rawP, err := rawArgv(f.rawSup, rawPath)
	if err != nil {
		return nil, err
	}
	var rv *rawVM
	vs = append(vs, variant{name: vRaw, accel: accel,
		start: func(ctx context.Context) error {
			var err error
			if rv, err = startRaw(prefix+"raw", rawP, f.rawCgroup); err != nil {
				return err
			}
			f.trackRaw(rv, true)
			if k == kindGuest {
				return waitMarker(ctx, rv.console, testenv.ReadyMarker)
			}
			return rv.waitRunning(ctx)
		},
		stop: func(ctx context.Context) error {
			defer f.trackRaw(rv, false)
			if k == kindGuest {
				return rv.powerdown(ctx)
			}
			return rv.quit(ctx)
		}})

	if withUnit {
		for _, confined := range []bool{false, true} {
			v, err := f.unitVariant(specDir, prefix, k, memMiB, confined)
			if err != nil {
				return nil, err
			}
			vs = append(vs, v)
		}
	}

	vv, err := f.vmsupVariants(specDir, prefix, k, memMiB)
	if err != nil {
		return nil, err
	}
	vs = append(vs, vv...)

	lvg := f.lvGuest
	virshName := prefix + "virsh"
	xmlPath := filepath.Join(specDir, virshName+".xml")
	if err := os.WriteFile(xmlPath, []byte(f.lv.domainXML(virshName, k, memMiB, f.blank, lvg)), 0o644); err != nil {
		return nil, err
	}
	vs = append(vs, variant{name: vVirsh, accel: accel,
		start: func(ctx context.Context) error {
			os.Remove(f.lv.consoleLog(virshName))
			if err := f.lv.virsh(ctx, "create", xmlPath); err != nil {
				return err
			}
			if k == kindGuest {
				return waitMarker(ctx, f.lv.consoleLog(virshName), testenv.ReadyMarker)
			}
			return nil
		},
		stop: func(ctx context.Context) error {
			if k == kindGuest {
				// virsh shutdown only asks; the stop ends when the domain is gone.
				if err := f.lv.virsh(ctx, "shutdown", virshName); err != nil {
					return err
				}
				return f.lv.waitGone(ctx, virshName)
			}
			return f.lv.virsh(ctx, "destroy", virshName)
		}})

	if withLvAPI {
		lvName := prefix + "lvapi"
		xml := f.lv.domainXML(lvName, k, memMiB, f.blank, lvg)
		vs = append(vs, variant{name: vLvAPI, accel: accel,
			start: func(context.Context) error {
				_, err := f.lv.create(xml)
				return err
			},
			stop: func(context.Context) error { return f.lv.destroy(lvName) }})
	}
	return vs, nil
}

// startStop is sections 1 and 2 (forced): one idle KVM VM started until QMP
// reports running, then stopped at once.
func (f *fixture) startStop(ctx context.Context) error {
	const sec1, sec2 = "1. start (no guest OS, until QMP reports running)", "2. stop"
	defer keepKVMACL(f.idle == kindIdle)()
	vs, err := f.variants(f.idle, 128, "s", true, true)
	if err != nil {
		return err
	}
	res, err := f.interleave(ctx, "start/stop", f.cfg.reps, vs, 60*time.Second)
	if err != nil {
		return err
	}
	r := f.report
	targetRaw := map[string]float64{vAPI: 1.20, vCLI: 1.20}
	for _, v := range vs {
		s := res[v.name]
		row := bench.Row{Section: sec1, Figure: "start", Variant: v.name, Accel: v.accel, Unit: "ms",
			Summary: bench.Summarize(bench.Millis(s.start)), Failures: s.startFail, Note: s.note()}
		if v.name != vRaw {
			row.Baseline, row.Target = vRaw, targetRaw[v.name]
		}
		r.Add(row)
	}
	// The libvirt target pairs like with like: one process per command
	// (vmsup CLI vs virsh) and one long-lived connection (Go API vs libvirt's).
	for _, p := range []struct{ vm, lv string }{{vAPI, vLvAPI}, {vCLI, vVirsh}} {
		lv, vm := res[p.lv], res[p.vm]
		r.Add(bench.Row{Section: sec1, Figure: "start vs libvirt", Variant: p.lv, Accel: f.idle.accel(), Unit: "ms",
			Summary: bench.Summarize(bench.Millis(lv.start)), Failures: lv.startFail})
		r.Add(bench.Row{Section: sec1, Figure: "start vs libvirt", Variant: p.vm, Accel: f.idle.accel(), Unit: "ms",
			Summary: bench.Summarize(bench.Millis(vm.start)), Failures: vm.startFail, Baseline: p.lv, Target: 0.40})
	}
	// vmsup's own cost: the same confined unit vmsup starts, without vmsup.
	f.confinedRows(sec1, "start vs confined unit", res, func(s *samples) ([]time.Duration, int) { return s.start, s.startFail })
	for _, st := range f.trace.order {
		r.Add(bench.Row{Section: sec1, Figure: "vmsup Up step: " + st, Variant: vAPI, Accel: f.idle.accel(), Unit: "ms",
			Summary: bench.Summarize(bench.Millis(f.trace.steps[st]))})
	}
	r.Add(bench.Row{Section: sec1, Figure: "vmsup Up step: confirm", Variant: vUnit, Accel: f.idle.accel(), Unit: "ms",
		Summary: bench.Summarize(bench.Millis(f.unitAfterJob)), Note: "the same wait after the start job, raw QMP client polling every 1 ms"})
	f.trace.steps, f.trace.order, f.unitAfterJob = nil, nil, nil
	stopNote := map[string]string{
		vRaw:   "QMP quit until the process exits",
		vUnit:  "StopUnit (SIGTERM) until the job is done",
		vConf:  "StopUnit: its stop hook (/bin/true while QEMU runs), SIGTERM, its stop-post hook (/bin/true); until the job is done",
		vAPI:   "Down with stop_timeout 1ms: powerdown, then quit; until the unit is gone",
		vCLI:   "vmsup down, same",
		vVirsh: "virsh destroy",
		vLvAPI: "DomainDestroy",
	}
	f.stopRows(sec2, "forced stop (no guest OS)", vs, res, stopNote)
	// vmsup's own cost of a stop: the confined unit has the same sandbox
	// and the same two stop hooks, running /bin/true.
	f.confinedRows(sec2, "forced stop vs confined unit", res, func(s *samples) ([]time.Duration, int) { return s.stop, s.stopFail })
	return nil
}

// confinedRows sets vmsup's figure (pick: its samples and failures)
// against the confined unit's: what vmsup adds to the same unit.
func (f *fixture) confinedRows(sec, figure string, res map[string]*samples, pick func(*samples) ([]time.Duration, int)) {
	for _, v := range []string{vConf, vAPI, vCLI} {
		d, failed := pick(res[v])
		row := bench.Row{Section: sec, Figure: figure, Variant: v, Accel: f.idle.accel(), Unit: "ms",
			Summary: bench.Summarize(bench.Millis(d)), Failures: failed}
		if v != vConf {
			row.Baseline = vConf
		}
		f.report.Add(row)
	}
}

// boot is section 3 and the graceful half of section 2: the test guest under
// TCG to its console marker, then an ACPI power-off it honours.
func (f *fixture) boot(ctx context.Context) error {
	const sec3, sec2 = "3. boot to the guest's console marker (TCG)", "2. stop"
	vs, err := f.variants(kindGuest, 256, "b", false, false)
	if err != nil {
		return err
	}
	res, err := f.interleave(ctx, "boot", f.cfg.bootReps, vs, 120*time.Second)
	if err != nil {
		return err
	}
	f.trace.steps, f.trace.order = nil, nil
	r := f.report
	for _, v := range vs {
		s := res[v.name]
		row := bench.Row{Section: sec3, Figure: "exec to " + testenv.ReadyMarker, Variant: v.name, Accel: v.accel, Unit: "ms",
			Summary: bench.Summarize(bench.Millis(s.start)), Failures: s.startFail, Note: s.note()}
		if v.name != vRaw {
			row.Baseline = vRaw
			if v.name == vAPI || v.name == vCLI {
				row.Target = 1.10
			}
		}
		r.Add(row)
	}
	stopNote := map[string]string{
		vRaw:   "QMP system_powerdown until QEMU exits",
		vAPI:   "Down: powerdown, guest powers off, unit gone",
		vCLI:   "vmsup down, same",
		vVirsh: "virsh shutdown, then until the domain is gone",
	}
	f.stopRows(sec2, "graceful stop (ACPI; test guest, TCG)", vs, res, stopNote)
	return nil
}

func joinNote(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

// unitVariant starts vmsup's argv as a transient unit without vmsup: bare
// (root, no sandbox) or confined (the sandbox supervisor.sandboxUnit gives a
// VM with one read-only disk and no NICs: the QEMU user, binds, hidden
// state directories), to tell systemd's and the sandbox's cost from vmsup's.
func (f *fixture) unitVariant(specDir, prefix string, k vmKind, memMiB int, confined bool) (variant, error) {
	tag, name, sup := "unit", vUnit, f.rawSup
	if confined {
		tag, name, sup = "conf", vConf, f.confSup
	}
	path, err := specFile(specDir, prefix+tag, k, memMiB, f.blank, f.guest)
	if err != nil {
		return variant{}, err
	}
	rp, err := rawArgv(sup, path)
	if err != nil {
		return variant{}, err
	}
	argv, dir := rp.argv, rp.dir
	u := bareUnit(prefix+tag, argv, memMiB, k.accel() == "kvm")
	var prep func() error
	if confined {
		if u.Sandbox, err = confinedSandbox(dir, f.blank, k.accel() == "kvm"); err != nil {
			return variant{}, err
		}
		// vmsup's two stop hooks, doing nothing: what systemd's spawns of
		// them in this sandbox cost a stop, apart from vmsup's own work.
		u.ExecStop = [][]string{units.WhileMainRuns([]string{"/bin/true"})}
		u.ExecStopPost = [][]string{{"/bin/true"}}
		u.StopHooksPrivileged = true
		// vmsup grants its QEMU user /dev/kvm (an ACL entry) while its VMs
		// run and takes it back after; without vmsup, grant it here.
		uid, _, err := qemuUser()
		if err != nil {
			return variant{}, err
		}
		prep = func() error {
			if k.accel() != "kvm" {
				return nil
			}
			if _, err := posixacl.GrantUser("/dev/kvm", uint32(uid), 6); err != nil {
				return fmt.Errorf("grant /dev/kvm: %w", err)
			}
			return nil
		}
	}
	return variant{name: name, accel: k.accel(), prep: prep,
		start: func(ctx context.Context) error {
			for _, s := range []string{"qmp.sock", "events.sock", "console.sock"} {
				os.Remove(filepath.Join(dir, s))
			}
			if err := f.sd.Start(ctx, u); err != nil {
				return err
			}
			t0 := time.Now()
			c, err := dialRawQMP(ctx, filepath.Join(dir, "qmp.sock"), nil)
			if err != nil {
				return err
			}
			defer c.Close()
			if err := c.expectRunning(); err != nil {
				return err
			}
			if k != kindGuest && !confined {
				f.unitAfterJob = append(f.unitAfterJob, time.Since(t0))
			}
			return nil
		},
		stop: func(ctx context.Context) error {
			if err := f.sd.Stop(ctx, u.Name); err != nil {
				return err
			}
			return f.sd.ResetFailed(ctx, u.Name)
		}}, nil
}

// stopRows adds one stop row per variant, against raw QEMU.
func (f *fixture) stopRows(sec, figure string, vs []variant, res map[string]*samples, notes map[string]string) {
	for _, v := range vs {
		s := res[v.name]
		row := bench.Row{Section: sec, Figure: figure, Variant: v.name, Accel: v.accel, Unit: "ms",
			Summary: bench.Summarize(bench.Millis(s.stop)), Failures: s.stopFail, Note: joinNote(notes[v.name], s.note())}
		if v.name != vRaw {
			row.Baseline = vRaw
		}
		f.report.Add(row)
	}
}

// vmsupVariants are the start/stop variants through vmsup itself: the Go
// API (one Supervisor) and the CLI (a process per command).
func (f *fixture) vmsupVariants(specDir, prefix string, k vmKind, memMiB int) ([]variant, error) {
	g, accel := f.guest, k.accel()
	var vs []variant
	apiName := prefix + "api"
	apiPath, err := specFile(specDir, apiName, k, memMiB, f.blank, g)
	if err != nil {
		return nil, err
	}
	vs = append(vs, variant{name: vAPI, accel: accel,
		start: func(ctx context.Context) error {
			f.trace.begin()
			defer f.trace.end()
			sf, err := spec.Load(apiPath)
			if err != nil {
				return err
			}
			if _, err := f.sup.Up(ctx, sf); err != nil {
				return err
			}
			f.trace.end()
			if k == kindGuest {
				return waitMarker(ctx, filepath.Join(f.sup.Root(), "vms", apiName, "console.log"), testenv.ReadyMarker)
			}
			return nil
		},
		stop: func(ctx context.Context) error {
			r, err := f.sup.Down(ctx, apiName)
			if err == nil && k == kindGuest && r.Step != supervisor.StoppedACPI {
				return fmt.Errorf("vmsup down: stopped by %s, not by the guest's ACPI power-off", r.Step)
			}
			return err
		}})

	cliName := prefix + "cli"
	cliPath, err := specFile(specDir, cliName, k, memMiB, f.blank, g)
	if err != nil {
		return nil, err
	}
	vs = append(vs, variant{name: vCLI, accel: accel,
		start: func(ctx context.Context) error {
			if err := f.runCLI(ctx, "up", cliPath); err != nil {
				return err
			}
			if k == kindGuest {
				return waitMarker(ctx, filepath.Join(f.dir, "cliroot", "vms", cliName, "console.log"), testenv.ReadyMarker)
			}
			return nil
		},
		stop: func(ctx context.Context) error { return f.runCLI(ctx, "down", cliName) }})
	return vs, nil
}
