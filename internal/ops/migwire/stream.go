package migwire

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	goqmp "github.com/digitalocean/go-qemu/qmp"

	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// ErrCancelled is a migration cancelled by the user (Ctrl-C, or a
// migrate_cancel from another process).
var ErrCancelled = errors.New("migration cancelled")

// TCGStopAndCopy: QEMU 7.2's TCG loses guest writes that race with a
// dirty-bitmap sync (a vCPU store through a TLB entry read before the sync
// reset it is never marked dirty), so a live precopy of a TCG guest can
// corrupt it: measured here under load, 1 of 12 and 1 of 6 raw QEMU
// migrations ended in guest kernel oopses or a hung guest, and 0 of 35 with
// the vCPUs stopped first. KVM tracks dirty pages in the kernel and is not
// affected. The source therefore copies TCG guests with their vCPUs stopped:
// correct, with a pause as long as the copy.
const TCGStopAndCopy = true

// qemuDefaultBandwidth is QEMU 7.2's max-bandwidth default. vmsup sets
// every parameter on each migration, because QEMU keeps them between
// migrations (a failed throttled attempt would throttle the next one).
const qemuDefaultBandwidth = 128 << 20

// Progress is one progress report of a migration.
type Progress struct {
	Status           qmp.MigrationStatus `json:"status"`
	Elapsed          time.Duration       `json:"elapsed_ns"`
	Transferred      int64               `json:"transferred_bytes"`
	Remaining        int64               `json:"remaining_bytes"`
	Total            int64               `json:"total_bytes"`
	Rate             float64             `json:"rate_bytes_per_s"`
	DirtyRate        int64               `json:"dirty_bytes_per_s"`
	ExpectedDowntime time.Duration       `json:"expected_downtime_ns"`
	Iterations       int64               `json:"iterations"`
	// Disks: the copied disks' jobs (status "disks" while they run
	// before the RAM): bytes sent and their total so far.
	DiskTransferred int64 `json:"disk_transferred_bytes,omitempty"`
	DiskTotal       int64 `json:"disk_total_bytes,omitempty"`
}

// Run is one migration as the source's vmsup drives it.
type Run struct {
	Mon *qmp.Conn // the source QEMU's event monitor
	URI string    // where it streams (the main channel)
	// CPR, when set, makes it a cpr-transfer (QEMU 10, one host): the
	// source's QEMU hands the destination its state and guest RAM (shared
	// memory) over this unix socket, the destination's cpr channel, and
	// sends the rest on URI once the destination listens there.
	CPR string
	// Mode is the "mode" migration parameter to set, "" for none (QEMU
	// before 8.2 has none): QEMU keeps it between migrations, so a source
	// that can do cpr-transfer is set back to "normal" for a normal one.
	Mode string
	Opts Options
	// StoppedMark, when set, stops the source's vCPUs before the stream
	// (a stop-and-copy), recorded first in that file.
	StoppedMark string
	Start       time.Time
	// OnPostcopy runs the guest on the destination once the source
	// switched to postcopy.
	OnPostcopy func() error
	// Listen, for cpr-transfer, has the destination listen for the stream
	// once the source's QEMU sent its state on the cpr channel (the
	// destination's QEMU makes its machine from it, then answers QMP).
	Listen func() error
	// PreSwitchover, when set, pauses the stream before the switch-over
	// (QEMU's pause-before-switchover: the guest is stopped, the RAM
	// sent but the devices' state not yet) and runs it there: the copied
	// disks' jobs end then, the guest writing nothing more. Then the
	// stream goes on.
	PreSwitchover func(ctx context.Context) error
	// DiskProgress, when set, adds the disks' figures to each progress
	// report.
	DiskProgress func(*Progress)
	Log          *slog.Logger
}

// Streamed is what a stream that ended tells.
type Streamed struct {
	Info     qmp.MigrationInfo
	Postcopy bool
	// Stopped is when the source's guest stopped (its QEMU's STOP event),
	// zero if not seen.
	Stopped time.Time
}

// Stream runs the migration on the source's QEMU until it completes, fails,
// is cancelled, stalls or times out, and returns the final figures.
func Stream(ctx context.Context, r Run) (Streamed, error) {
	if err := configure(ctx, r.Mon, r.Opts, r.Mode, r.PreSwitchover != nil); err != nil {
		return Streamed{}, err
	}
	sub, unsub := r.Mon.Subscribe(context.WithoutCancel(ctx))
	defer unsub()
	w := &streamWatch{mon: r.Mon, o: r.Opts, start: r.Start, onPostcopy: r.OnPostcopy, log: r.Log, lastBytes: -1, lastMove: time.Now(),
		preSwitchover: r.PreSwitchover, diskProgress: r.DiskProgress}
	if err := begin(ctx, r); err != nil {
		return Streamed{}, err
	}
	if r.CPR != "" {
		if err := r.Listen(); err != nil {
			// The destination's QEMU has the state but does not listen:
			// cancelled here, the source's guest runs on.
			_, err = cancelAndWait(context.WithoutCancel(ctx), r.Mon, fmt.Errorf("cpr-transfer: the destination: %w", err))
			return Streamed{}, err
		}
	}
	info, ended, err := w.run(ctx, sub)
	if !ended {
		info, err = cancelAndWait(context.WithoutCancel(ctx), r.Mon, w.cancelWhy)
	}
	return Streamed{Info: info, Postcopy: w.postcopy, Stopped: w.stopped}, err
}

// configure sets the migration's capabilities and parameters from o, and
// the migration mode if one is given; pause: pause before the switch-over.
func configure(ctx context.Context, mon *qmp.Conn, o Options, mode string, pause bool) error {
	bw := o.Bandwidth
	if bw <= 0 {
		bw = qemuDefaultBandwidth
	}
	dt := int64(300)
	if o.Downtime > 0 {
		dt = o.Downtime.Milliseconds()
	}
	params := qmp.MigrationParameters{MaxBandwidth: &bw, DowntimeLimit: &dt}
	if o.Multifd > 0 {
		n := int64(o.Multifd)
		params.MultifdChannels = &n
	}
	if mode != "" {
		params.Mode = &mode
	}
	caps := []qmp.MigrationCapability{
		{Capability: "events", State: true},
		{Capability: "multifd", State: o.Multifd > 0},
		{Capability: "postcopy-ram", State: o.Postcopy},
		{Capability: "auto-converge", State: o.AutoConverge},
		{Capability: "pause-before-switchover", State: pause},
	}
	if err := mon.MigrateSetCapabilities(ctx, caps); err != nil {
		return fmt.Errorf("capabilities: %w", err)
	}
	if err := mon.MigrateSetParameters(ctx, params); err != nil {
		return fmt.Errorf("parameters: %w", err)
	}
	return nil
}

// begin stops the source's vCPUs for a stop-and-copy (recorded first in
// the mark), then starts the stream: to URI, or for cpr-transfer with its
// cpr channel too (QEMU stops the guest itself once the destination
// listens: its RAM is not copied).
func begin(ctx context.Context, r Run) error {
	if r.StoppedMark != "" {
		// Recorded before the stop: if this vmsup dies mid-stream, the
		// next command on the VM resumes a source whose migration failed
		// (recoverStoppedSource); QEMU itself resumes only a source that
		// was running when the migration began.
		if err := os.WriteFile(r.StoppedMark, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o600); err != nil {
			return fmt.Errorf("record the paused source: %w", err)
		}
		if err := r.Mon.Stop(ctx); err != nil {
			os.Remove(r.StoppedMark)
			return fmt.Errorf("stop the source's vCPUs: %w", err)
		}
	}
	if r.CPR != "" {
		if err := r.Mon.MigrateCPR(ctx, r.URI, r.CPR); err != nil {
			return fmt.Errorf("migrate %s (cpr-transfer, cpr channel %s): %w", r.URI, r.CPR, err)
		}
		return nil
	}
	if err := r.Mon.Migrate(ctx, r.URI); err != nil {
		return fmt.Errorf("migrate %s: %w", r.URI, err)
	}
	return nil
}

// streamWatch follows one running migration.
type streamWatch struct {
	mon        *qmp.Conn
	o          Options
	start      time.Time
	onPostcopy func() error
	log        *slog.Logger

	postcopy  bool
	stopped   time.Time // the source's STOP event
	lastBytes int64
	lastMove  time.Time
	cancelWhy error // set: the stream must be cancelled for this reason

	preSwitchover func(context.Context) error
	diskProgress  func(*Progress)
	switched      bool // preSwitchover ran
}

// run watches events and polls until the migration ends (ended) or must be
// cancelled (cancelWhy set, ended false).
func (w *streamWatch) run(ctx context.Context, sub <-chan goqmp.Event) (info qmp.MigrationInfo, ended bool, err error) {
	tick := time.NewTicker(w.o.ProgressInterval)
	defer tick.Stop()
	deadline := time.NewTimer(w.o.Timeout)
	defer deadline.Stop()
	var pcTimer <-chan time.Time
	if w.o.Postcopy {
		t := time.NewTimer(w.o.PostcopyAfter)
		defer t.Stop()
		pcTimer = t.C
	}
	bg := context.WithoutCancel(ctx)
	done := ctx.Done() // nil once seen: in postcopy there is nothing to cancel
	for w.cancelWhy == nil {
		var status qmp.MigrationStatus
		select {
		case ev, ok := <-sub:
			if !ok {
				return qmp.MigrationInfo{}, true, fmt.Errorf("source QEMU went away: %w", w.mon.Err())
			}
			if ev.Event == "STOP" {
				w.stopped = EventTime(ev)
			}
			status = migrationStatus(ev)
		case <-tick.C:
			if status, err = w.poll(bg); err != nil {
				return info, true, err
			}
		case <-pcTimer:
			if err := w.mon.MigrateStartPostcopy(bg); err != nil {
				w.log.Warn("migrate-start-postcopy", "err", err)
			}
			continue
		case <-deadline.C:
			if !w.postcopy {
				w.cancelWhy = fmt.Errorf("did not converge within %s", w.o.Timeout)
			}
			continue
		case <-done:
			done = nil
			if !w.postcopy {
				w.cancelWhy = ErrCancelled
			}
			continue
		}
		if info, ended, err = w.settle(bg, status); ended {
			return info, true, err
		}
	}
	return qmp.MigrationInfo{}, false, nil
}

// poll asks QEMU how the stream goes: its status, progress for the caller,
// and a stall (no bytes moved for StallTimeout) before postcopy.
func (w *streamWatch) poll(ctx context.Context) (qmp.MigrationStatus, error) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	info, err := w.mon.QueryMigrate(qctx)
	cancel()
	if err != nil {
		return "", fmt.Errorf("query-migrate: %w", err)
	}
	if info.RAM != nil {
		if info.RAM.Transferred != w.lastBytes {
			w.lastBytes, w.lastMove = info.RAM.Transferred, time.Now()
		} else if time.Since(w.lastMove) > w.o.StallTimeout && !w.postcopy {
			w.cancelWhy = fmt.Errorf("no progress for %s (network down?)", w.o.StallTimeout)
		}
	}
	if w.o.Progress != nil {
		p := progressOf(info, time.Since(w.start))
		if w.diskProgress != nil {
			w.diskProgress(&p)
		}
		w.o.Progress(p)
	}
	return info.Status, nil
}

// settle acts on a status: the migration ended (completed, failed,
// cancelled), or switched to postcopy (the destination runs the guest now).
func (w *streamWatch) settle(ctx context.Context, status qmp.MigrationStatus) (qmp.MigrationInfo, bool, error) {
	switch status {
	case qmp.MigrationCompleted:
		return FinalInfo(ctx, w.mon), true, nil
	case qmp.MigrationFailed:
		info, _ := w.mon.QueryMigrate(ctx)
		return info, true, fmt.Errorf("migration failed: %s", cmp.Or(info.ErrorDesc, "QEMU gave no reason"))
	case qmp.MigrationCancelled:
		return qmp.MigrationInfo{}, true, ErrCancelled
	case qmp.MigrationPreSwitchover:
		if w.preSwitchover == nil || w.switched {
			break
		}
		w.switched = true
		if err := w.preSwitchover(ctx); err != nil {
			w.cancelWhy = err
			break
		}
		if err := w.mon.MigrateContinue(ctx, qmp.MigrationPreSwitchover); err != nil {
			w.cancelWhy = fmt.Errorf("migrate-continue: %w", err)
		}
	case qmp.MigrationPostcopyActive:
		if !w.postcopy {
			w.postcopy = true
			// The source is stopped for good: run the guest on the
			// destination now, its missing pages come on demand.
			if err := w.onPostcopy(); err != nil {
				return qmp.MigrationInfo{}, true, fmt.Errorf("postcopy: start the destination: %w", err)
			}
		}
	}
	return qmp.MigrationInfo{}, false, nil
}

// cancelAndWait cancels the stream for why and waits for QEMU to say it
// stopped (it may also complete meanwhile: the destination is still torn
// down, the source resumed).
func cancelAndWait(ctx context.Context, mon *qmp.Conn, why error) (qmp.MigrationInfo, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := mon.MigrateCancel(cctx); err != nil {
		return qmp.MigrationInfo{}, fmt.Errorf("%w; migrate_cancel: %v", why, err)
	}
	for {
		info, err := mon.QueryMigrate(cctx)
		if err != nil {
			return info, fmt.Errorf("%w; after migrate_cancel: %v", why, err)
		}
		switch info.Status {
		case qmp.MigrationCancelled, qmp.MigrationFailed, qmp.MigrationCompleted:
			return info, why
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// EventTime is when QEMU emitted ev (its host clock).
func EventTime(ev goqmp.Event) time.Time {
	return time.Unix(ev.Timestamp.Seconds, ev.Timestamp.Microseconds*1000)
}

func migrationStatus(ev goqmp.Event) qmp.MigrationStatus {
	if ev.Event != "MIGRATION" {
		return ""
	}
	st, _ := ev.Data["status"].(string)
	return qmp.MigrationStatus(st)
}

// FinalInfo reads the figures of a completed migration; right after
// "completed" QEMU may still report total-time 0.
func FinalInfo(ctx context.Context, mon *qmp.Conn) qmp.MigrationInfo {
	var info qmp.MigrationInfo
	for i := 0; i < 20; i++ {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var err error
		info, err = mon.QueryMigrate(qctx)
		cancel()
		if err == nil && info.TotalTime > 0 {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	return info
}

func progressOf(info qmp.MigrationInfo, elapsed time.Duration) Progress {
	p := Progress{Status: info.Status, Elapsed: elapsed, ExpectedDowntime: time.Duration(info.ExpectedDowntime) * time.Millisecond}
	if r := info.RAM; r != nil {
		p.Transferred, p.Remaining, p.Total = r.Transferred, r.Remaining, r.Total
		p.Rate = r.Mbps * 1e6 / 8
		ps := r.PageSize
		if ps == 0 {
			ps = 4096
		}
		p.DirtyRate = r.DirtyPagesRate * ps
		p.Iterations = r.DirtySyncCount
	}
	return p
}

// ResumeSource makes sure the source's guest runs after a failed attempt.
// QEMU resumes it after a failed or cancelled migration; after "completed"
// it stays paused ("postmigrate") until cont.
func ResumeSource(mon *qmp.Conn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		qs, err := mon.QueryStatus(ctx)
		if err != nil {
			return fmt.Errorf("source QEMU: %w", err)
		}
		switch qs.Status {
		case qmp.RunRunning:
			return nil
		case qmp.RunPostMigrate, qmp.RunPaused:
			if err := mon.Cont(ctx); err != nil {
				return fmt.Errorf("cont the source: %w", err)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("source QEMU is %q", qs.Status)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Disk markers: the source drops a marker file beside each file disk, so
// that the destination can prove it sees the same directory (shared
// storage). Disks in directories vmsup cannot write get no marker; the
// destination then only checks that the file exists.

// PlanMarkers names the marker to put beside each file disk (disk file ->
// marker), without making them: the journal records them first.
func PlanMarkers(name string, f *spec.File) map[string]string {
	m := map[string]string{}
	for _, d := range f.VM.Disks {
		if d.File == "" || !filepath.IsAbs(d.File) {
			continue // network storage (RBD, iSCSI) is shared by nature
		}
		if st, err := os.Stat(d.File); err != nil || !st.Mode().IsRegular() {
			continue // a block device path: its directory says nothing
		}
		m[d.File] = filepath.Join(filepath.Dir(d.File), ".vmsup-migrate-"+name+"-"+RandHex(8))
	}
	return m
}

// MakeMarkers makes the planned markers; those that cannot be made (a
// directory vmsup cannot write) are left out. cleanup removes them.
func MakeMarkers(plan map[string]string) (map[string]string, func()) {
	m := map[string]string{}
	var made []string
	for disk, mk := range plan {
		if err := os.WriteFile(mk, nil, 0o600); err != nil {
			continue
		}
		m[disk] = mk
		made = append(made, mk)
	}
	return m, func() {
		for _, mk := range made {
			os.Remove(mk)
		}
	}
}

// AwaitIncoming waits until the destination's QEMU has the whole stream
// (its incoming migration "completed"), or says it failed.
func AwaitIncoming(ctx context.Context, mon *qmp.Conn) error {
	for {
		info, err := mon.QueryMigrate(ctx)
		if err != nil {
			return fmt.Errorf("incoming migration: %w", err)
		}
		switch info.Status {
		case qmp.MigrationCompleted:
			return nil
		case qmp.MigrationFailed, qmp.MigrationCancelled:
			return fmt.Errorf("incoming migration %s: %s", info.Status, info.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("incoming migration still %q", info.Status)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// RunPostcopy runs the destination's guest as soon as the source switched to
// postcopy: its pages arrive on demand, and the source is stopped for good.
func RunPostcopy(ctx context.Context, mon *qmp.Conn) error {
	for {
		qs, err := mon.QueryStatus(ctx)
		if err != nil {
			return fmt.Errorf("postcopy: %w", err)
		}
		if qs.Running {
			return nil
		}
		if qs.Status != qmp.RunInMigrate {
			if err := mon.Cont(ctx); err != nil {
				return fmt.Errorf("postcopy: cont: %w", err)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("postcopy: destination still %q", qs.Status)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
