package supervisor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/supervisor"
)

// TestMigrationFigures prints total time, downtime and bytes for a 256 MiB
// and a 1 GiB guest: a raw QMP-driven migration (a hand-started destination
// QEMU, unix socket) next to vmsup's, local and cross-host, and the effect
// of max-bandwidth and multifd. Run: VMSUP_FIGURES=1 go test ./supervisor
// -run TestMigrationFigures -v
func TestMigrationFigures(t *testing.T) {
	if os.Getenv("VMSUP_FIGURES") == "" {
		t.Skip("figures take ~3 minutes of TCG guests: set VMSUP_FIGURES=1 to measure")
	}
	a, b := twoHosts(t)
	mems := []string{"256M", "1G"}
	if m := os.Getenv("VMSUP_FIGURES_MEM"); m != "" {
		mems = strings.Fields(m)
	}
	for _, mem := range mems {
		t.Run(mem, func(t *testing.T) {
			ctx := ctxT(t, 10*time.Minute)
			dir := t.TempDir()
			name := "fig" + strings.ToLower(mem)
			f := migGuest(t, dir, name, mem, filepath.Join(dir, "data.raw"))
			if _, err := a.Sup.Up(ctx, f); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				a.Sup.Down(context.Background(), name)
				b.Sup.Down(context.Background(), name)
			})
			st, _ := a.Sup.Status(ctx, name)
			waitConsole(t, st, "VMSUP-SHELL-READY", 120*time.Second)
			// Each figure is the median of three runs, with the range.
			type sample struct {
				total, down, wall time.Duration
				bytes             int64
			}
			row := func(phase, what string, runs []sample) {
				med := func(get func(sample) time.Duration) string {
					v := make([]time.Duration, len(runs))
					for i, r := range runs {
						v[i] = get(r)
					}
					slices.Sort(v)
					return fmt.Sprintf("%s (%s-%s)", v[len(v)/2], v[0], v[len(v)-1])
				}
				t.Logf("FIGURE %-5s %-6s %-42s total %-22s downtime %-20s transferred %5.1f MiB  wall %s", mem, phase, what,
					med(func(r sample) time.Duration { return r.total }), med(func(r sample) time.Duration { return r.down }),
					float64(runs[len(runs)/2].bytes)/(1<<20),
					med(func(r sample) time.Duration { return r.wall.Round(time.Millisecond) }))
			}
			const n = 3
			for _, phase := range []string{"idle", "filled"} {
				if phase == "filled" {
					// Half the guest's RAM with non-zero data (a file in the
					// initramfs of 1 MiB of random bytes repeated): QEMU sends
					// zero pages as a few bytes, so an idle guest moves far
					// less than its size.
					mib := map[string]int{"256M": 128, "1G": 512}[mem]
					sh, err := testenv.DialConsole(ctx, st.Console)
					if err != nil {
						t.Fatal(err)
					}
					fctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
					t0 := time.Now()
					out, code, err := sh.Run(fctx, fmt.Sprintf("dmesg -n 1; dd if=/dev/urandom of=/r1m bs=1M count=1 2>/dev/null; "+
						"i=0; while [ $i -lt %d ]; do cat /r1m; i=$((i+1)); done > /fill; rm /r1m", mib))
					cancel()
					sh.Close()
					if err != nil || code != 0 {
						t.Fatalf("fill: %d %v %q", code, err, tail(out, 300))
					}
					t.Logf("filled %d MiB in %s", mib, time.Since(t0).Round(time.Millisecond))
				}
				for _, bw := range []int64{128 << 20, 1 << 30} {
					var runs []sample
					for range n {
						total, down, bytes, wall := rawMigration(t, ctx, st, bw)
						runs = append(runs, sample{total, down, wall, bytes})
					}
					row(phase, fmt.Sprintf("raw QMP, unix, max-bandwidth %d MiB/s", bw>>20), runs)
				}
				cases := []struct {
					what string
					o    supervisor.MigrateOptions
				}{
					{"vmsup --local (128 MiB/s default)", supervisor.MigrateOptions{Local: true}},
					{"vmsup --local --bandwidth 1G", supervisor.MigrateOptions{Local: true, Bandwidth: 1 << 30}},
					{"vmsup --local --bandwidth 1G --multifd 4", supervisor.MigrateOptions{Local: true, Bandwidth: 1 << 30, Multifd: 4}},
					{"vmsup --local --bandwidth 32M", supervisor.MigrateOptions{Local: true, Bandwidth: 32 << 20}},
				}
				for _, c := range cases {
					var runs []sample
					for range n {
						res, err := a.Sup.Migrate(ctx, name, c.o)
						if err != nil {
							t.Fatalf("%s: %v", c.what, err)
						}
						runs = append(runs, sample{res.TotalTime, res.Downtime, res.Wall, res.Transferred})
					}
					row(phase, c.what, runs)
				}
				// Across the veth: A->B, B->A, A->B measured, then back to A.
				for _, c := range []struct {
					what string
					o    supervisor.MigrateOptions
				}{
					{"vmsup A<->B tcp (128 MiB/s default)", supervisor.MigrateOptions{}},
					{"vmsup A<->B tcp --bandwidth 1G", supervisor.MigrateOptions{Bandwidth: 1 << 30}},
					{"vmsup A<->B tcp --bandwidth 1G --multifd 4", supervisor.MigrateOptions{Bandwidth: 1 << 30, Multifd: 4}},
				} {
					var runs []sample
					from, to := a, b
					for i := range n + 1 {
						o := c.o
						o.To, o.Address, o.Transport, o.Dial = to.Name, to.Addr, to.Transport(""), from.Dial
						res, err := from.Sup.Migrate(ctx, name, o)
						if err != nil {
							t.Fatalf("%s: %v", c.what, err)
						}
						if i < n {
							runs = append(runs, sample{res.TotalTime, res.Downtime, res.Wall, res.Transferred})
						}
						from, to = to, from
					}
					row(phase, c.what, runs)
				}
			}
			st, _ = a.Sup.Status(ctx, name)
			if lastCounter(t, st.ConsoleLog) < 0 {
				t.Fatalf("no counter on the console")
			}
			t.Cleanup(func() {
				if t.Failed() {
					b, _ := os.ReadFile(st.ConsoleLog)
					t.Logf("console tail:\n%s", tail(string(b), 3000))
					t.Logf("status: %+v", st)
				}
			})
			checkContinuous(t, waitCounterPast(t, st.ConsoleLog, lastCounter(t, st.ConsoleLog)+3, 30*time.Second))
		})
	}
}

// rawMigration migrates the running VM by hand: a destination QEMU started
// directly (no unit) from the VM's argv with -S -incoming defer, QMP
// commands on both monitors. The destination is then killed and the source
// resumed, so the VM is where it was.
func rawMigration(t *testing.T, ctx context.Context, st supervisor.Status, bw int64) (total, down time.Duration, bytes int64, wall time.Duration) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(st.StateDir)), "records", st.Name, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var app struct{ Argv []string }
	if err := json.Unmarshal(b, &app); err != nil {
		t.Fatal(err)
	}
	// Inside the VM's state directory, owned like it, and the destination
	// run as that owner: a confined source QEMU sees only that directory
	// and runs as that user.
	rawDir, err := os.MkdirTemp(st.StateDir, "raw-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(rawDir)
	fi, err := os.Stat(st.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	owner := fi.Sys().(*syscall.Stat_t)
	if err := os.Chown(rawDir, int(owner.Uid), int(owner.Gid)); err != nil {
		t.Fatal(err)
	}
	// The recorded argv of a migrated VM has its incoming flags and socket
	// directory: drop the flags, make the directories.
	argv := make([]string, 0, len(app.Argv)+3)
	incomingDir := regexp.MustCompile(regexp.QuoteMeta(rawDir) + `/incoming-[0-9a-f]+/`)
	for i := 0; i < len(app.Argv); i++ {
		a := app.Argv[i]
		if a == "-S" || (a == "-incoming" && i+1 < len(app.Argv)) {
			if a == "-incoming" {
				i++
			}
			continue
		}
		a = strings.ReplaceAll(a, st.StateDir, rawDir)
		argv = append(argv, incomingDir.ReplaceAllString(a, rawDir+"/"))
	}
	argv[0] = "/usr/bin/qemu-system-x86_64"
	argv = append(argv, "-S", "-incoming", "defer")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: owner.Uid, Gid: owner.Gid}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	dial := func(p string) *qmp.Conn {
		for i := 0; ; i++ {
			c, err := qmp.Dial(ctx, p)
			if err == nil {
				return c
			}
			if i > 200 {
				t.Fatalf("dial %s: %v", p, err)
			}
			time.Sleep(25 * time.Millisecond)
		}
	}
	dst := dial(filepath.Join(rawDir, "qmp.sock"))
	defer dst.Close()
	src := dial(filepath.Join(st.StateDir, "events.sock"))
	defer src.Close()
	caps := []qmp.MigrationCapability{{Capability: "events", State: true}, {Capability: "multifd", State: false}}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(dst.MigrateSetCapabilities(ctx, caps))
	uri := "unix:" + filepath.Join(rawDir, "mig.sock")
	must(dst.MigrateIncoming(ctx, uri))
	must(src.MigrateSetCapabilities(ctx, caps))
	dt := int64(300)
	must(src.MigrateSetParameters(ctx, qmp.MigrationParameters{MaxBandwidth: &bw, DowntimeLimit: &dt}))
	t0 := time.Now()
	must(src.Migrate(ctx, uri))
	var info qmp.MigrationInfo
	for {
		info, err = src.QueryMigrate(ctx)
		must(err)
		if info.Status == "completed" && info.TotalTime > 0 {
			break
		}
		if info.Status == "failed" || info.Status == "cancelled" {
			t.Fatalf("raw migration %s: %s", info.Status, info.ErrorDesc)
		}
		time.Sleep(10 * time.Millisecond)
	}
	wall = time.Since(t0)
	cmd.Process.Kill()
	cmd.Wait()
	must(src.Cont(ctx))
	if info.RAM != nil {
		bytes = info.RAM.Transferred
	}
	return time.Duration(info.TotalTime) * time.Millisecond, time.Duration(info.Downtime) * time.Millisecond, bytes, wall
}
