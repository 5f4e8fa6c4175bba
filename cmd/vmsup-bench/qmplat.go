package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/vmsup/vmsup/internal/dev/bench"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// qmpLatency is section 6: round trips to one idle VM started by vmsup.
// Persistent clients alternate call by call, one on each of the VM's two
// QMP monitors (qmp.sock, events.sock), swapping monitors every round.
func (f *fixture) qmpLatency(ctx context.Context) error {
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
	lat := &latencies{d: map[string][]time.Duration{}, fails: map[string]int{}}
	for r := 0; r < f.cfg.reps; r++ {
		step(fmt.Sprintf("qmp: round %d of %d", r+1, f.cfg.reps))
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := lat.persistent(cctx, socks[r%2], socks[(r+1)%2], f.cfg.qmpCalls)
		if err == nil {
			f.perCall(cctx, lat, name, f.cfg.qmpCalls)
		}
		cancel()
		if err != nil {
			return err
		}
	}
	f.reportQMP(lat)
	return nil
}

// latencies are section 6's timings by variant key, and failures.
type latencies struct {
	d     map[string][]time.Duration
	fails map[string]int
}

func (l *latencies) timed(key string, fn func() error) {
	t0 := time.Now()
	if err := fn(); err != nil {
		l.fails[key]++
		return
	}
	l.d[key] = append(l.d[key], time.Since(t0))
}

// persistent times kept-open clients: vmsup's qmp.Conn on vmSock, the raw
// client on rawSock, call by call.
func (l *latencies) persistent(ctx context.Context, vmSock, rawSock string, calls int) error {
	vc, err := qmp.Dial(ctx, vmSock)
	if err != nil {
		return err
	}
	defer vc.Close()
	rc, err := dialRawQMP(ctx, rawSock, nil)
	if err != nil {
		return err
	}
	defer rc.Close()
	for i := 0; i < calls; i++ {
		l.timed("vmqs", func() error { _, err := vc.QueryStatus(ctx); return err })
		l.timed("rawqs", func() error { _, err := rc.call(`{"execute":"query-status"}`); return err })
	}
	for i := 0; i < calls/4; i++ {
		l.timed("vmsc", func() error {
			if err := vc.Stop(ctx); err != nil {
				return err
			}
			return vc.Cont(ctx)
		})
		l.timed("rawsc", func() error {
			if _, err := rc.call(`{"execute":"stop"}`); err != nil {
				return err
			}
			_, err := rc.call(`{"execute":"cont"}`)
			return err
		})
	}
	return nil
}

// perCall times what one vmsup call costs when it connects for each
// command: the Supervisor's QMP and Pause/Resume, and the CLI.
func (f *fixture) perCall(ctx context.Context, l *latencies, name string, calls int) {
	for i := 0; i < calls/10; i++ {
		l.timed("supqs", func() error {
			_, err := f.sup.QMP(ctx, name, []byte(`{"execute":"query-status"}`), false) // policy check and audit log included
			return err
		})
	}
	for i := 0; i < calls/20; i++ {
		l.timed("supsc", func() error {
			if err := f.sup.Pause(ctx, name); err != nil {
				return err
			}
			return f.sup.Resume(ctx, name)
		})
	}
	for i := 0; i < 3; i++ {
		l.timed("cliqs", func() error {
			return f.runCLI(ctx, "--root", f.sup.Root(), "qmp", name, `{"execute":"query-status"}`)
		})
	}
}

func (f *fixture) reportQMP(l *latencies) {
	const sec = "6. QMP round trip (idle VM, TCG)"
	add := func(fig, variant, key, base, note string) {
		f.report.Add(bench.Row{Section: sec, Figure: fig, Variant: variant, Accel: "tcg", Unit: "ms", ShowP99: true,
			Summary: bench.Summarize(bench.Millis(l.d[key])), Failures: l.fails[key], Baseline: base, Note: note})
	}
	add("query-status", "raw socket client", "rawqs", "", "kept open; json.Unmarshal of each line")
	add("query-status", "vmsup qmp.Conn", "vmqs", "raw socket client", "kept open")
	add("query-status", "vmsup Supervisor.QMP", "supqs", "raw socket client", "per call: QMP lock, dial, negotiate, command")
	add("query-status", "vmsup qmp (CLI)", "cliqs", "raw socket client", "per call: a vmsup process")
	add("stop+cont", "raw socket client", "rawsc", "", "")
	add("stop+cont", "vmsup qmp.Conn", "vmsc", "raw socket client", "")
	add("stop+cont", "vmsup Pause+Resume", "supsc", "raw socket client", "VM lock, dial, stop/cont and a query-status check, twice")
}
