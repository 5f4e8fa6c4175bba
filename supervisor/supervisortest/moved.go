package supervisortest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
)

// SettleShutOff waits until the guardians settled a move of the shut-off
// VM vm (vmsup move) that a kill interrupted (no operation pending, no
// guardian on any host; nothing else runs a command meanwhile), then
// checks that exactly one host defines it, shut off, with its disk's image
// (disk, as that host sees it), and that the others know nothing of it and
// have no image at disk. It returns that host.
func SettleShutOff(t *testing.T, ctx context.Context, vm, disk string, hosts ...*Host) *Host {
	t.Helper()
	deadline := time.Now().Add(GuardianWait)
	for {
		why := ""
		for _, h := range hosts {
			s := &Side{Name: h.Name, SD: h.SD, Root: h.Root}
			if pendingOp(s, vm) {
				why = h.Name + ": an operation is pending"
			}
			if guardianRuns(ctx, s, vm) {
				why = h.Name + ": the guardian runs"
			}
		}
		if why == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("vm %s: the guardians did not settle the move within %s: %s", vm, GuardianWait, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var on *Host
	for _, h := range hosts {
		st, err := h.Sup.Status(ctx, vm)
		switch {
		case err == nil && st.State == supervisor.StateShutOff:
			if on != nil {
				t.Fatalf("vm %s: defined on %s and %s", vm, on.Name, h.Name)
			}
			on = h
		case err == nil:
			t.Fatalf("%s: vm %s is %s, want shut off or unknown", h.Name, vm, st.State)
		case !errors.Is(err, supervisor.ErrNotFound):
			t.Fatalf("%s: status: %v", h.Name, err)
		}
	}
	if on == nil {
		t.Fatalf("vm %s: defined nowhere", vm)
	}
	for _, h := range hosts {
		if there := h.HasFile(disk); there != (h == on) {
			t.Fatalf("%s: the disk's image %s there: %v; the VM is defined on %s", h.Name, disk, there, on.Name)
		}
		left, _ := filepath.Glob(filepath.Join(h.Root, "vms", vm, "*-out-*"))
		if qsd := filepath.Join(h.Root, "vms", vm, "move-qsd.sock"); Exists(qsd) {
			left = append(left, qsd)
		}
		if len(left) > 0 {
			t.Fatalf("%s: left in the state directory: %v", h.Name, left)
		}
		if h == on {
			continue
		}
		for _, d := range []string{filepath.Join(h.Root, "vms", vm), filepath.Join(h.Root, "records", vm)} {
			if Exists(d) {
				t.Fatalf("%s: %s left", h.Name, d)
			}
		}
		if out, _ := h.SD.Systemctl(ctx, "list-units", "--all", "--no-legend", "vmsup-"+vm+"*"); strings.TrimSpace(string(out)) != "" {
			t.Fatalf("%s: units left: %s", h.Name, out)
		}
	}
	return on
}

// HasFile reports whether path exists as h sees it (its sandbox's mount
// namespace: a LocalDisks directory is each host's own).
func (h *Host) HasFile(path string) bool {
	return exec.Command("nsenter", "-t", fmt.Sprint(h.SD.PID1), "-m", "test", "-e", path).Run() == nil
}

// Exists reports whether path exists (as this process sees it).
func Exists(path string) bool { _, err := os.Lstat(path); return err == nil }
