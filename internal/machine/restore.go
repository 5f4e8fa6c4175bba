package machine

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/memstate"
	"github.com/vmsup/vmsup/qmp"
)

// restoreState is the last step of a start from a memory snapshot: QEMU
// started with -incoming defer reads the state from the file (opened here
// and passed as a descriptor: the confined QEMU has no path to it,
// memstate.Load), then the guest resumes where the snapshot left it.
func (r *startRun) restoreState(ctx context.Context) error {
	f, err := os.Open(r.restore)
	if err != nil {
		return err
	}
	defer f.Close()
	// QEMU's own words say why a state did not load (it exits).
	words := func(err error) error {
		return fmt.Errorf("%w: %s", err, r.s.LastWords(context.WithoutCancel(ctx), r.plan.Unit))
	}
	c, release, err := r.monitor(ctx)
	if err != nil {
		return words(err)
	}
	defer release()
	if err := memstate.Load(ctx, c, f); err != nil {
		return words(err)
	}
	if err := c.Cont(ctx); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	qs, err := c.QueryStatus(ctx)
	if err != nil {
		return err
	}
	if !qs.Running {
		return fmt.Errorf("QEMU is %q after the restore, not running", qs.Status)
	}
	return nil
}

// monitor waits for the new QEMU's monitor to answer (it may take a
// moment after the unit started), as long as its unit runs.
func (r *startRun) monitor(ctx context.Context) (*qmp.Conn, func(), error) {
	timeout := ConfirmTimeout(r.app.Accel)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if _, err := os.Stat(r.p.QMP); err == nil {
			c, release, err := r.s.QMPSession(wctx, r.name)
			if err == nil {
				return c, release, nil
			}
		}
		if st, err := r.sd.Status(wctx, r.plan.Unit); err == nil && st.Gone() {
			return nil, nil, fmt.Errorf("QEMU exited (%s)", orDefault(st.ExitReason(), st.ActiveState))
		}
		select {
		case <-wctx.Done():
			return nil, nil, fmt.Errorf("QEMU did not answer on QMP within %s", timeout)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
