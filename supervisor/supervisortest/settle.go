package supervisortest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor"
)

// Side is one host as the fault checks (Settle) see it.
type Side struct {
	Name string
	SD   *testenv.Systemd
	Root string
	Sup  *supervisor.Supervisor
	Job  FaultJob // its supervisor's options, for jobs run there
}

// NewSide returns the side name: the supervisor sup (a new one on root
// when nil) on systemd sd, with e's QEMU and self as the vmsup binary, and
// the same options in Job for the commands run there in a child.
func NewSide(t *testing.T, e *testenv.Env, self, name string, sd *testenv.Systemd, root, unitDir string, sup *supervisor.Supervisor) *Side {
	if sup == nil {
		sup = New(t, e, root, self)
	}
	return &Side{Name: name, SD: sd, Root: root, Sup: sup, Job: FaultJob{
		Root: root, Bus: sd.BusAddress, JournalDir: sd.JournalDir, QEMU: e.QEMU, Self: self,
		UnitDir: unitDir, RunDir: filepath.Join(root, "run"), HostCache: e.CapsCache}}
}

// Settle waits until no operation on the VM is pending on any of sides
// (the guardian or status finishes it), then checks: one QEMU in all, on
// the side whose status says running, the guest's counter advancing there,
// the other sides knowing nothing of the VM, no unit but the running one,
// and no marker (in markers, the directory of the VM's shared disk, if
// set), relay socket or incoming directory left. It returns that side, and
// its status in stOut if set, with Recovery the last one any side reported.
func Settle(t *testing.T, ctx context.Context, vm string, sides []*Side, markers string, stOut *supervisor.Status) *Side {
	t.Helper()
	var on *Side
	var st supervisor.Status
	var why, recovery string
	w := testenv.StartGuestWait("a VM settles", 2*time.Minute)
	for {
		on, why = nil, ""
		for _, s := range sides {
			x, err := s.Sup.Status(ctx, vm)
			if x.Recovery != "" {
				recovery = x.Recovery
			}
			switch {
			case err == nil && x.State == supervisor.StateRunning:
				if on != nil {
					why = fmt.Sprintf("running on %s and %s", on.Name, s.Name)
				}
				on, st = s, x
			case err != nil && !errors.Is(err, supervisor.ErrNotFound):
				why = fmt.Sprintf("%s: status: %v", s.Name, err)
			case err == nil:
				why = fmt.Sprintf("%s: %s (%s)", s.Name, x.State, x.Reason)
			}
			if pendingOp(s, vm) {
				why = s.Name + ": an operation is pending"
			}
			if guardianRuns(ctx, s, vm) {
				why = s.Name + ": the guardian runs"
			}
		}
		if on == nil && why == "" {
			why = "runs nowhere"
		}
		if why == "" {
			break
		}
		if w.Expired() {
			dumpGuardians(t, ctx, vm, sides)
			t.Fatalf("vm %s did not settle: %s (last recovery: %s); %s", vm, why, recovery, w.Explain())
		}
		time.Sleep(100 * time.Millisecond)
	}
	w.Done()
	// One QEMU, where status says.
	total := 0
	for _, s := range sides {
		pids := qemuIn(s.SD, vm)
		total += len(pids)
		if s == on && (len(pids) != 1 || pids[0] != QEMUPID(s.SD, st.Unit)) {
			t.Fatalf("%s: status says %s runs but its QEMUs are %v", s.Name, st.Unit, pids)
		}
		out, _ := s.SD.Systemctl(ctx, "list-units", "--all", "--no-legend", "--plain", "vmsup-"+vm+".service", "vmsup-"+vm+"@*")
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if f := strings.Fields(l); len(f) > 0 && (s != on || f[0] != st.Unit) {
				t.Fatalf("%s: unit left: %s", s.Name, l)
			}
		}
		dir := filepath.Join(s.Root, "vms", vm)
		left, _ := filepath.Glob(filepath.Join(dir, "incoming-*"))
		socks, _ := filepath.Glob(filepath.Join(dir, "migrate-out-*"))
		nbd, _ := filepath.Glob(filepath.Join(dir, "nbd-out-*"))
		if left = append(append(left, socks...), nbd...); len(left) > 0 {
			t.Fatalf("%s: left in the state directory: %v", s.Name, left)
		}
		if s != on {
			if _, err := os.Stat(dir); err == nil {
				t.Fatalf("%s: a stale state directory %s", s.Name, dir)
			}
			if _, err := os.Stat(filepath.Join(s.Root, "records", vm)); err == nil {
				t.Fatalf("%s: a stale record", s.Name)
			}
		}
	}
	if total != 1 {
		t.Fatalf("%d QEMUs run the guest", total)
	}
	if markers != "" {
		if mk, _ := filepath.Glob(filepath.Join(markers, ".vmsup-migrate-"+vm+"-*")); len(mk) > 0 {
			t.Fatalf("markers left: %v", mk)
		}
	}
	waitCounterMoves(t, st.ConsoleLog, 30*time.Second, func() string {
		b, _ := on.Sup.QMP(ctx, vm, []byte(`{"execute":"query-status"}`), false)
		r, _ := on.Sup.QMP(ctx, vm, []byte(`{"execute":"human-monitor-command","arguments":{"command-line":"info registers"}}`), false)
		st, err := on.Sup.Status(ctx, vm)
		j, _ := on.SD.Journal(ctx, st.Unit)
		return fmt.Sprintf("%s\n%s\nstatus %s (%s) %v\nunit journal:\n%s", b, Tail(string(r), 600), st.State, st.Reason, err, Tail(j, 1500))
	})
	st.Recovery = recovery
	if stOut != nil {
		*stOut = st
	}
	return on
}

// SettleGuarded is Settle after a killed command that has a guardian (a
// migration, either end): it first waits, running no command that could
// recover anything itself (status would), until no operation is pending
// and no guardian runs on any side, so that the guardians alone must have
// settled what the command left. An operation left pending with no
// guardian to settle it fails the test at once, with the sides' guardian
// logs. Then Settle checks the result.
func SettleGuarded(t *testing.T, ctx context.Context, vm string, sides []*Side, markers string, stOut *supervisor.Status) *Side {
	t.Helper()
	deadline := time.Now().Add(GuardianWait)
	orphaned := map[*Side]time.Time{} // since when an operation is pending without a guardian
	for {
		why := ""
		for _, s := range sides {
			pending := pendingOp(s, vm)
			guardian := guardianRuns(ctx, s, vm)
			switch {
			case guardian:
				why = s.Name + ": the guardian runs"
			case pending:
				why = s.Name + ": an operation is pending and no guardian runs"
				if orphaned[s].IsZero() {
					orphaned[s] = time.Now()
				}
				// A command ending cleanly ends its journal before it stops
				// its guardian: this is not a moment between the two.
				if time.Since(orphaned[s]) > 3*time.Second {
					dumpGuardians(t, ctx, vm, sides)
					t.Fatalf("vm %s: %s (its guardian ended, or never started, without settling it)", vm, why)
				}
			}
			if !pending {
				delete(orphaned, s)
			}
		}
		if why == "" {
			break
		}
		if time.Now().After(deadline) {
			dumpGuardians(t, ctx, vm, sides)
			t.Fatalf("vm %s: the guardians did not settle it within %s: %s", vm, GuardianWait, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var st supervisor.Status
	on := Settle(t, ctx, vm, sides, markers, &st)
	// A truthful record: the running side knows what it runs.
	if st.SpecFile == "" || st.CPUs == 0 || st.Memory == "" {
		t.Fatalf("%s: status says running but records no spec: file %q, %d CPUs, memory %q", on.Name, st.SpecFile, st.CPUs, st.Memory)
	}
	if stOut != nil {
		*stOut = st
	}
	return on
}

// GuardianWait bounds how long SettleGuarded waits for the guardians: their
// own retries (supervisor.Settle) end within a few minutes.
const GuardianWait = 6 * time.Minute

func pendingOp(s *Side, vm string) bool {
	_, err := os.Stat(filepath.Join(s.Root, "records", vm, "op.json"))
	return err == nil
}

func guardianRuns(ctx context.Context, s *Side, vm string) bool {
	out, _ := s.SD.Systemctl(ctx, "list-units", "--all", "--no-legend", "--plain", "vmsup-"+vm+"@settle.service")
	return strings.TrimSpace(string(out)) != ""
}

// dumpGuardians logs each side's pending journal, lock holder and guardian
// log.
func dumpGuardians(t *testing.T, ctx context.Context, vm string, sides []*Side) {
	t.Helper()
	for _, s := range sides {
		opj, _ := os.ReadFile(filepath.Join(s.Root, "records", vm, "op.json"))
		holder, _ := os.ReadFile(filepath.Join(s.Root, "vms", "."+vm+".lock"))
		journal, _ := s.SD.Journal(ctx, "vmsup-"+vm+"@settle.service")
		t.Logf("%s: journal %s; lock holder %q; guardian:\n%s", s.Name, strings.TrimSpace(string(opj)), holder, Tail(journal, 3000))
	}
}

// qemuIn returns the QEMU processes in the VM's units (both names).
func qemuIn(sd *testenv.Systemd, vm string) []int {
	var out []int
	for _, u := range []string{"vmsup-" + vm + ".service", "vmsup-" + vm + "@migrated.service"} {
		pids, _ := sd.HostPIDs(u)
		for _, p := range pids {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); err == nil && strings.HasPrefix(string(b), "qemu-system") {
				out = append(out, p)
			}
		}
	}
	return out
}

// QEMUPID is the host PID of the unit's QEMU in sd (0 if none).
func QEMUPID(sd *testenv.Systemd, unit string) int {
	pids, _ := sd.HostPIDs(unit)
	for _, p := range pids {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); err == nil && strings.HasPrefix(string(b), "qemu-system") {
			return p
		}
	}
	return 0
}
