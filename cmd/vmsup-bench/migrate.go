package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmsup/vmsup/internal/bench"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// migrateSizes are the guest memory sizes of the migrate section.
var migrateSizes = []string{"256M", "1G", "4G"}

// Variants of the migrate section.
const (
	vMigNormal = "normal (RAM copied)"
	vMigCPR    = "cpr-transfer (RAM taken in place)"
)

// migrateLocal measures `vmsup migrate --local` (the Go API's Migrate, as
// the CLI runs it) on the booted test guest (TCG, idle) of each size: the
// guest's pause, from the source QEMU's STOP event to the destination's
// RESUME, with its RAM copied (--no-cpr) and, where this QEMU has
// cpr-transfer (QEMU 10), taken over in place. The variants alternate on
// the same guest, which must still answer on its console after them.
func (f *fixture) migrateLocal(ctx context.Context) error {
	dir := filepath.Join(f.dir, "mig")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cprOK, cprWhy := f.env.Caps.CPRTransfer()
	reps := max(3, f.cfg.migReps)
	for _, size := range migrateSizes {
		step(fmt.Sprintf("migrate --local: %s guest, %d reps", size, reps))
		if err := f.migrateSize(ctx, dir, size, reps, cprOK); err != nil {
			return fmt.Errorf("%s guest: %w", size, err)
		}
	}
	if !cprOK {
		f.report.Note("10. migrate --local: no cpr-transfer rows: %s (run the section under scripts/testing/with-qemu10).", cprWhy)
	}
	f.report.Note("10. migrate --local: the test guest idle (its kernel, initramfs and a counter printed every 0.2 s), 1 vCPU, TCG, default bandwidth (QEMU's 128 MiB/s). The RAM copy is a stop-and-copy here (TCG guests: vmsup stops the vCPUs for the whole copy, migration.TCGStopAndCopy), so its pause is the whole copy; cpr-transfer sends only the devices' state. The pause includes vmsup's finalize (the destination runs with -S until the source saw the stream complete).")
	return nil
}

// migrateSize boots a guest of size, migrates it reps times each way
// (alternating which goes first), checks it still answers, and removes it.
func (f *fixture) migrateSize(ctx context.Context, dir, size string, reps int, cprOK bool) error {
	sup := f.sup
	name := "mig" + strings.ToLower(size)
	vm, err := f.migrateGuest(dir, name, size)
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
	variants := []string{vMigNormal}
	if cprOK {
		variants = append(variants, vMigCPR)
	}
	pause, wall, down := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	for i := range reps {
		for j := range variants {
			v := variants[(i+j)%len(variants)]
			res, err := sup.Migrate(ctx, name, supervisor.MigrateOptions{Local: true, NoCPR: v == vMigNormal})
			if err != nil {
				return fmt.Errorf("%s: %w", v, err)
			}
			if want := map[string]string{vMigNormal: supervisor.MigrationModeNormal, vMigCPR: supervisor.MigrationModeCPRTransfer}[v]; res.Mode != want {
				return fmt.Errorf("%s: the migration was %s (%s)", v, res.Mode, res.ModeNote)
			}
			if res.Pause > 0 {
				pause[v] = append(pause[v], ms(res.Pause))
			}
			wall[v], down[v] = append(wall[v], ms(res.Wall)), append(down[v], ms(res.Downtime))
		}
	}
	if err := consoleAnswers(ctx, sup, name, false); err != nil {
		return fmt.Errorf("after the migrations: %w", err)
	}
	f.addMigrateRows(size, variants, reps, pause, wall, down)
	return nil
}

// addMigrateRows adds one size's figures: the guest's pause and the whole
// command, each variant against the RAM copy.
func (f *fixture) addMigrateRows(size string, variants []string, reps int, pause, wall, down map[string][]float64) {
	const sec = "10. migrate --local (test guest, TCG, idle)"
	for _, v := range variants {
		base := ""
		if v != vMigNormal {
			base = vMigNormal
		}
		note := fmt.Sprintf("STOP (source QEMU) to RESUME (new QEMU); QEMU's own downtime median %.1f ms", bench.Summarize(down[v]).Median)
		f.report.Add(bench.Row{Section: sec, Figure: size + " guest: paused", Variant: v, Accel: "tcg", Unit: "ms",
			Summary: bench.Summarize(pause[v]), Baseline: base, Failures: reps - len(pause[v]), Note: note})
		f.report.Add(bench.Row{Section: sec, Figure: size + " guest: whole migrate --local", Variant: v, Accel: "tcg", Unit: "ms",
			Summary: bench.Summarize(wall[v]), Baseline: base, Note: "prepare (new QEMU's unit), stream, finalize, hand-over"})
	}
}

// migrateGuest is the test guest with size of memory and its counter.
func (f *fixture) migrateGuest(dir, name, size string) (*spec.File, error) {
	body := fmt.Sprintf(`name = %q
memory = %q
accel = "tcg"
stop_timeout = "10s"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check vmsup.counter"
`, name, size, f.guest.kernel, f.guest.initrd)
	path := filepath.Join(dir, name+".toml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		return nil, err
	}
	return spec.Load(path)
}
