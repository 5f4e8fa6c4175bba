package supervisor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// TestResize: a running guest gets a second vCPU and a 128M DIMM live, both
// online in the guest; the unit's CPU quota and weight change; the DIMM goes
// again; what cannot be done live is refused with a reason and changes
// nothing; a resized VM is not migrated.
func TestResize(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	sup := newSup(t, "")
	dir := t.TempDir()
	path := filepath.Join(dir, "resize.toml")
	body := fmt.Sprintf(`name = "resize"
memory = "256M"
max_memory = "512M"
cpus = 1
max_cpus = 2
accel = "tcg"
stop_timeout = "10s"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check vmsup.online memhp_default_state=online_movable"
`, env.Guest.Kernel, env.Guest.Initrd)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	defer sup.Down(ctx, "resize")
	st, _ := sup.Status(ctx, "resize")
	g := bootGuest(t, ctx, st)
	memTotal := func() int64 {
		kb, _ := strconv.ParseInt(g.run(`awk '/^MemTotal:/ {print $2}' /proc/meminfo`), 10, 64)
		return kb << 10
	}
	before := memTotal()

	m := func(s string) spec.Size { z, _ := spec.ParseSize(s); return z }
	for _, c := range []struct {
		o    supervisor.ResizeOptions
		want string
	}{
		{supervisor.ResizeOptions{CPUs: 3}, "cpus 3 is above max_cpus 2"},
		{supervisor.ResizeOptions{Memory: m("1G")}, "memory 1G is above max_memory 512M"},
		{supervisor.ResizeOptions{Memory: m("300M")}, "steps of 128M"},
		{supervisor.ResizeOptions{Memory: m("128M")}, "below the 256M the VM booted with"},
	} {
		if _, err := sup.Resize(ctx, "resize", c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%+v: want %q, got %v", c.o, c.want, err)
		}
	}

	quota, weight := 150, 50
	res, err := sup.Resize(ctx, "resize", supervisor.ResizeOptions{CPUs: 2, Memory: m("384M"), CPUQuota: &quota, CPUWeight: &weight})
	if err != nil {
		t.Fatal(err)
	}
	if res.CPUs != 2 || res.Memory != m("384M") || !strings.Contains(res.Note, "live only") {
		t.Fatalf("resize: %+v", res)
	}
	if got := g.run(`for i in $(seq 100); do [ "$(cat /sys/devices/system/cpu/online)" = 0-1 ] && break; sleep 0.2; done; cat /sys/devices/system/cpu/online`); got != "0-1" {
		t.Fatalf("guest CPUs online: %q", got)
	}
	var grown int64
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if grown = memTotal() - before; grown >= 120<<20 {
			break
		}
	}
	if grown < 120<<20 || grown > 128<<20 {
		t.Fatalf("guest MemTotal grew by %d bytes, want ~128 MiB", grown)
	}
	out, _ := env.Systemd.Systemctl(ctx, "show", "-p", "CPUQuotaPerSecUSec,CPUWeight", "vmsup-resize.service")
	if !strings.Contains(string(out), "CPUQuotaPerSecUSec=1.500000s") || !strings.Contains(string(out), "CPUWeight=50") {
		t.Fatalf("unit limits: %s", out)
	}
	if st, _ := sup.Status(ctx, "resize"); st.CPUs != 2 || st.Memory != "384M" {
		t.Fatalf("status after resize: cpus %d memory %s", st.CPUs, st.Memory)
	}
	if _, err := sup.Migrate(ctx, "resize", supervisor.MigrateOptions{Local: true}); err == nil || !strings.Contains(err.Error(), "changed live") {
		t.Fatalf("migration of a resized VM: %v", err)
	}

	// The DIMM goes again (the guest onlined it movable); vCPUs stay.
	if res, err = sup.Resize(ctx, "resize", supervisor.ResizeOptions{Memory: m("256M")}); err != nil || res.Memory != m("256M") {
		t.Fatalf("remove the DIMM: %+v %v", res, err)
	}
	if got := memTotal(); got != before {
		t.Fatalf("guest MemTotal %d after the DIMM went, want %d", got, before)
	}
	if _, err := sup.Resize(ctx, "resize", supervisor.ResizeOptions{CPUs: 1}); err == nil || !strings.Contains(err.Error(), "removing vCPUs") {
		t.Fatalf("vCPU removal: %v", err)
	}
	if r, err := sup.QMP(ctx, "resize", []byte(`{"execute":"query-memory-devices"}`), false); err != nil || !strings.Contains(string(r), `"return": []`) && !strings.Contains(string(r), `"return":[]`) {
		t.Fatalf("memory devices left: %s %v", r, err)
	}
}

// TestResizeOnlinesByAgent: a guest with no rule that onlines hot-plugged
// vCPUs and memory (Debian's case: they arrived offline, and vmsup said
// nothing) gets them online through its agent, and set's note says so;
// the DIMM, onlined movable by the guest's policy, goes again. A guest
// without an agent gets a note that says what it must do.
func TestResizeOnlinesByAgent(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	sup := newSup(t, "")
	dir := t.TempDir()
	load := func(name, extra, cmdline string) *spec.File {
		t.Helper()
		path := filepath.Join(dir, name+".toml")
		body := fmt.Sprintf("name = %q\nmemory = \"256M\"\nmax_memory = \"512M\"\ncpus = 1\nmax_cpus = 2\naccel = \"tcg\"\n"+
			"stop_timeout = \"10s\"\n%s\n[boot]\nkernel = %q\ninitrd = %q\ncmdline = %q\n",
			name, extra, env.Guest.Kernel, env.Guest.Initrd, "console=ttyS0 no_timer_check "+cmdline)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := spec.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sup.Up(ctx, f); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sup.Down(context.Background(), name) })
		return f
	}
	// Offline is the kernel's default for hot-added memory (said here in
	// case the guest kernel's is not); auto-movable is the zone policy of
	// an "online" write, the agent's.
	load("online", "", "memhp_default_state=offline memory_hotplug.online_policy=auto-movable")
	load("noagent", "guest_agent = false", "")

	st, _ := sup.Status(ctx, "online")
	g := bootGuest(t, ctx, st)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if a, err := sup.GuestPing(ctx, "online"); err == nil && a.Responding {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the guest agent never answered")
		}
	}
	memTotal := func() int64 {
		kb, _ := strconv.ParseInt(g.run(`awk '/^MemTotal:/ {print $2}' /proc/meminfo`), 10, 64)
		return kb << 10
	}
	before := memTotal()
	m := func(s string) spec.Size { z, _ := spec.ParseSize(s); return z }
	res, err := sup.Resize(ctx, "online", supervisor.ResizeOptions{CPUs: 2, Memory: m("384M")})
	if err != nil || !strings.Contains(res.Note, "the guest agent onlined 1 vCPU(s) and 128M of memory") {
		t.Fatalf("resize: %+v %v", res, err)
	}
	t.Logf("note: %s", res.Note)
	if got := g.run(`cat /sys/devices/system/cpu/online`); got != "0-1" {
		t.Fatalf("guest CPUs online: %q", got)
	}
	if grown := memTotal() - before; grown < 120<<20 || grown > 128<<20 {
		t.Fatalf("guest MemTotal grew by %d bytes, want ~128 MiB", grown)
	}
	if res, err := sup.Resize(ctx, "online", supervisor.ResizeOptions{Memory: m("256M")}); err != nil || res.Memory != m("256M") {
		t.Fatalf("remove the DIMM the agent onlined: %+v %v", res, err)
	}
	if got := memTotal(); got != before {
		t.Fatalf("guest MemTotal %d after the DIMM went, want %d", got, before)
	}

	res, err = sup.Resize(ctx, "noagent", supervisor.ResizeOptions{CPUs: 2})
	if err != nil || !strings.Contains(res.Note, "no guest agent runs: the guest must online them itself") {
		t.Fatalf("resize of a VM without an agent: %+v %v", res, err)
	}
	t.Logf("note without an agent: %s", res.Note)
}
