package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmsup/vmsup/internal/dev/bench"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// migrateSizes are the guest memory sizes of the migrate section.
var migrateSizes = []string{"256M", "1G", "4G"}

// Variants of the migrate section: the RAM copied from private memory (a
// VM with shared_memory = false, or any VM on QEMU 7.2), copied from
// shared memory (--no-cpr), and taken over in place.
const (
	vMigPrivate = "copied, private memory"
	vMigShared  = "copied, shared memory (--no-cpr)"
	vMigCPR     = "cpr-transfer (taken in place)"
)

// migFigures are one variant's measurements.
type migFigures struct{ pause, wall, down []float64 }

// migrateLocal measures `vmsup migrate --local` (the Go API's Migrate, as
// the CLI runs it) on booted test guests (TCG, idle) of each size: the
// guest's pause, from the source QEMU's STOP event to the new QEMU's
// RESUME, and the whole command. A guest with private memory is copied; one
// with shared memory (where this QEMU has cpr-transfer: QEMU 10) is copied
// and taken over in place, alternately. Each guest must still answer on its
// console after its migrations.
func (f *fixture) migrateLocal(ctx context.Context) error {
	dir := filepath.Join(f.dir, "mig")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cprOK, cprWhy := f.env.Caps.CPRTransfer()
	reps := max(3, f.cfg.migReps)
	for _, size := range migrateSizes {
		step(fmt.Sprintf("migrate --local: %s guests, %d reps", size, reps))
		figs := map[string]*migFigures{}
		if err := f.migrateGuestRuns(ctx, dir, size, false, reps, []string{vMigPrivate}, figs); err != nil {
			return fmt.Errorf("%s guest: %w", size, err)
		}
		variants := []string{vMigPrivate}
		if cprOK {
			if err := f.migrateGuestRuns(ctx, dir, size, true, reps, []string{vMigShared, vMigCPR}, figs); err != nil {
				return fmt.Errorf("%s guest: %w", size, err)
			}
			variants = append(variants, vMigShared, vMigCPR)
		}
		f.addMigrateRows(size, variants, reps, figs)
	}
	if !cprOK {
		f.report.Note("10. migrate --local: no shared-memory rows: %s (run the section under scripts/testing/with-qemu10).", cprWhy)
	}
	f.report.Note("10. migrate --local: the test guest idle (its kernel, initramfs and a counter printed every 0.2 s), 1 vCPU, TCG, default bandwidth (QEMU's 128 MiB/s); \"private memory\" is shared_memory = false. A copy is a stop-and-copy here (TCG guests: vmsup stops the vCPUs for the whole copy, migration.TCGStopAndCopy), so its pause is the whole copy; copying shared memory populates all of it on both sides (a read of an untouched shared page allocates it). cpr-transfer sends only the devices' state. Every pause includes vmsup's finalize (the destination runs with -S until the source saw the stream complete).")
	return nil
}

// migrateGuestRuns boots a guest of size (shared memory or private), runs
// reps rounds of the variants on it (rotating which goes first), checks it
// still answers, and removes it.
func (f *fixture) migrateGuestRuns(ctx context.Context, dir, size string, shared bool, reps int, variants []string, figs map[string]*migFigures) error {
	sup := f.sup
	name := "mig" + strings.ToLower(size)
	if !shared {
		name += "p"
	}
	vm, err := f.migrateGuest(dir, name, size, shared)
	if err != nil {
		return err
	}
	defer func() {
		dctx := context.WithoutCancel(ctx)
		sup.Down(dctx, name)
		sup.Remove(dctx, name)
	}()
	if _, err := sup.Up(ctx, vm); err != nil {
		return err
	}
	if err := consoleAnswers(ctx, sup, name, true); err != nil {
		return err
	}
	wantMode := map[string]string{vMigPrivate: supervisor.MigrationModeNormal, vMigShared: supervisor.MigrationModeNormal,
		vMigCPR: supervisor.MigrationModeCPRTransfer}
	for i := range reps {
		for j := range variants {
			v := variants[(i+j)%len(variants)]
			res, err := sup.Migrate(ctx, name, supervisor.MigrateOptions{Local: true, NoCPR: v == vMigShared})
			if err != nil {
				return fmt.Errorf("%s: %w", v, err)
			}
			if res.Mode != wantMode[v] {
				return fmt.Errorf("%s: the migration was %s (%s)", v, res.Mode, res.ModeNote)
			}
			fg := figs[v]
			if fg == nil {
				fg = &migFigures{}
				figs[v] = fg
			}
			if res.Pause > 0 {
				fg.pause = append(fg.pause, ms(res.Pause))
			}
			fg.wall, fg.down = append(fg.wall, ms(res.Wall)), append(fg.down, ms(res.Downtime))
		}
	}
	if err := consoleAnswers(ctx, sup, name, false); err != nil {
		return fmt.Errorf("after the migrations: %w", err)
	}
	return nil
}

// addMigrateRows adds one size's figures: the guest's pause and the whole
// command, each variant against the copy of private memory.
func (f *fixture) addMigrateRows(size string, variants []string, reps int, figs map[string]*migFigures) {
	const sec = "10. migrate --local (test guest, TCG, idle)"
	for _, v := range variants {
		base, fg := "", figs[v]
		if v != vMigPrivate {
			base = vMigPrivate
		}
		note := fmt.Sprintf("STOP (source QEMU) to RESUME (new QEMU); QEMU's own downtime median %.1f ms", bench.Summarize(fg.down).Median)
		f.report.Add(bench.Row{Section: sec, Figure: size + " guest: paused", Variant: v, Accel: "tcg", Unit: "ms",
			Summary: bench.Summarize(fg.pause), Baseline: base, Failures: reps - len(fg.pause), Note: note})
		f.report.Add(bench.Row{Section: sec, Figure: size + " guest: whole migrate --local", Variant: v, Accel: "tcg", Unit: "ms",
			Summary: bench.Summarize(fg.wall), Baseline: base, Note: "prepare (new QEMU's unit), stream, finalize, hand-over"})
	}
}

// migrateGuest is the test guest with size of memory, its counter, and
// shared (the default where QEMU has cpr-transfer) or private memory.
func (f *fixture) migrateGuest(dir, name, size string, shared bool) (*spec.File, error) {
	body := fmt.Sprintf(`name = %q
memory = %q
accel = "tcg"
stop_timeout = "10s"
shared_memory = %t

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check vmsup.counter"
`, name, size, shared, f.guest.kernel, f.guest.initrd)
	path := filepath.Join(dir, name+".toml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		return nil, err
	}
	return spec.Load(path)
}
