package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/vmsup/vmsup/internal/bench"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// qmpLatency is section 6: round trips to one idle VM started by vmsup.
// Persistent clients alternate call by call, one on each of the VM's two
// QMP monitors (qmp.sock, events.sock), swapping monitors every round.
func (f *fixture) qmpLatency(ctx context.Context) error {
	const sec = "6. QMP round trip (idle VM, TCG)"
	const name = "qlat"
	path, err := specFile(filepath.Join(f.dir, "specs"), name, kindIdleTCG, 128, f.blank, f.guest)
	if err != nil {
		return err
	}
	sf, err := spec.Load(path)
	if err != nil {
		return err
	}
	if _, err := f.sup.Up(ctx, sf); err != nil {
		return err
	}
	defer f.sup.Down(context.WithoutCancel(ctx), name)
	dir := filepath.Join(f.sup.Root(), "vms", name)
	socks := [2]string{filepath.Join(dir, "qmp.sock"), filepath.Join(dir, "events.sock")}
	var (
		rawQS, vmQS, supQS, cliQS []time.Duration
		rawSC, vmSC, supSC        []time.Duration
		fails                     = map[string]int{}
	)
	timed := func(dst *[]time.Duration, key string, fn func() error) {
		t0 := time.Now()
		if err := fn(); err != nil {
			fails[key]++
			return
		}
		*dst = append(*dst, time.Since(t0))
	}
	calls := f.cfg.qmpCalls
	for r := 0; r < f.cfg.reps; r++ {
		step(fmt.Sprintf("qmp: round %d of %d", r+1, f.cfg.reps))
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		vc, err := qmp.Dial(cctx, socks[r%2])
		if err != nil {
			cancel()
			return err
		}
		rc, err := dialRawQMP(cctx, socks[(r+1)%2], nil)
		if err != nil {
			vc.Close()
			cancel()
			return err
		}
		for i := 0; i < calls; i++ {
			timed(&vmQS, "vmqs", func() error { _, err := vc.QueryStatus(cctx); return err })
			timed(&rawQS, "rawqs", func() error { _, err := rc.call(`{"execute":"query-status"}`); return err })
		}
		for i := 0; i < calls/4; i++ {
			timed(&vmSC, "vmsc", func() error {
				if err := vc.Stop(cctx); err != nil {
					return err
				}
				return vc.Cont(cctx)
			})
			timed(&rawSC, "rawsc", func() error {
				if _, err := rc.call(`{"execute":"stop"}`); err != nil {
					return err
				}
				_, err := rc.call(`{"execute":"cont"}`)
				return err
			})
		}
		vc.Close()
		rc.Close()
		// What one vmsup call costs when it connects for each command.
		for i := 0; i < calls/10; i++ {
			timed(&supQS, "supqs", func() error {
				_, err := f.sup.QMP(cctx, name, []byte(`{"execute":"query-status"}`), false) // policy check and audit log included
				return err
			})
		}
		for i := 0; i < calls/20; i++ {
			timed(&supSC, "supsc", func() error {
				if err := f.sup.Pause(cctx, name); err != nil {
					return err
				}
				return f.sup.Resume(cctx, name)
			})
		}
		for i := 0; i < 3; i++ {
			timed(&cliQS, "cliqs", func() error {
				return f.runCLI(cctx, "--root", f.sup.Root(), "qmp", name, `{"execute":"query-status"}`)
			})
		}
		cancel()
	}
	r := f.report
	add := func(fig, variant string, d []time.Duration, key, base, note string) {
		r.Add(bench.Row{Section: sec, Figure: fig, Variant: variant, Accel: "tcg", Unit: "ms", ShowP99: true,
			Summary: bench.Summarize(bench.Millis(d)), Failures: fails[key], Baseline: base, Note: note})
	}
	add("query-status", "raw socket client", rawQS, "rawqs", "", "kept open; json.Unmarshal of each line")
	add("query-status", "vmsup qmp.Conn", vmQS, "vmqs", "raw socket client", "kept open")
	add("query-status", "vmsup Supervisor.QMP", supQS, "supqs", "raw socket client", "per call: QMP lock, dial, negotiate, command")
	add("query-status", "vmsup qmp (CLI)", cliQS, "cliqs", "raw socket client", "per call: a vmsup process")
	add("stop+cont", "raw socket client", rawSC, "rawsc", "", "")
	add("stop+cont", "vmsup qmp.Conn", vmSC, "vmsc", "raw socket client", "")
	add("stop+cont", "vmsup Pause+Resume", supSC, "supsc", "raw socket client", "VM lock, dial, stop/cont and a query-status check, twice")
	return nil
}
