package paritytest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/host/affinity"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestTopology: the guest sees the sockets, cores and NUMA nodes asked for, and
// a vCPU hot-plugged later lands in the next slot of that topology; each
// vCPU thread runs on the host CPU pinning.vcpus gives it, the hot-plugged
// one too.
func TestTopology(t *testing.T) {
	ctx := supervisortest.Context(t, 5*time.Minute)
	dir := t.TempDir()
	path := filepath.Join(dir, "topo.toml")
	body := fmt.Sprintf(`name = "topo"
memory = "256M"
accel = "tcg"
cpus = 2
max_cpus = 4
hotplug_slots = 0
stop_timeout = "20s"

[topology]
sockets = 2
cores = 2
threads = 1

[[numa]]
cpus = "0-1"
memory = "128M"

[[numa]]
cpus = "2-3"
memory = "128M"

[pinning]
vcpus = [1, 0, 1, 0]
emulator = "0-1"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check vmsup.online"
`, env.Guest.Kernel, env.Guest.Initrd)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	sup := supervisortest.New(t, env, "", vmsupBin)
	bad, err := spec.Parse(path, []byte(strings.Replace(body, "vcpus = [1, 0, 1, 0]", "vcpus = [1, 0, 1, 4095]", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := sup.Validate(bad); err == nil || !strings.Contains(err.Error(), "pinning.vcpus[3]: host CPU 4095 is not online here") {
		t.Errorf("a vCPU pinned to a CPU this host lacks: %v", err)
	}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	defer sup.Down(ctx, "topo")
	st, err := sup.Status(ctx, "topo")
	if err != nil {
		t.Fatal(err)
	}
	sh := supervisortest.Shell(t, ctx, st)
	// CPU N: package (socket), core, its thread siblings.
	topo := func() string {
		t.Helper()
		out, _, err := sh.Run(ctx, `for c in /sys/devices/system/cpu/cpu[0-9]*; do [ -e $c/topology/physical_package_id ] || continue; `+
			`echo "${c##*/} $(cat $c/topology/physical_package_id) $(cat $c/topology/core_id) $(cat $c/topology/thread_siblings_list)"; done`)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(strings.ReplaceAll(out, "\r", ""))
	}
	pinned(t, ctx, sup, []int{1, 0})
	// NUMA node N: its CPUs and its memory in MiB.
	nodes := func() string {
		t.Helper()
		out, _, err := sh.Run(ctx, `for n in /sys/devices/system/node/node[0-9]*; do `+
			`echo "${n##*/} $(cat $n/cpulist) $(( $(awk '/MemTotal/ {print $4}' $n/meminfo) / 1024 ))"; done`)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(strings.ReplaceAll(out, "\r", ""))
	}
	checkNodes := func(when, cpus1 string) {
		t.Helper()
		lines := strings.Split(nodes(), "\n")
		ok := len(lines) == 2
		for i, want := range []string{"0-1", cpus1} {
			if !ok {
				break
			}
			// "nodeN CPUS MIB", or "nodeN MIB" for a node without CPUs.
			f := strings.Fields(lines[i])
			cpus := ""
			if len(f) == 3 {
				cpus = f[1]
			}
			mib, err := strconv.Atoi(f[len(f)-1])
			// each node holds about its 128 MiB (less what the kernel keeps)
			ok = f[0] == fmt.Sprintf("node%d", i) && cpus == want && err == nil && mib >= 64 && mib <= 128
		}
		if !ok {
			t.Errorf("%s: guest NUMA nodes (node cpus MiB):\n%s\nwant node0 with CPUs 0-1, node1 with %q, ~128 MiB each", when, strings.Join(lines, "\n"), cpus1)
		}
	}
	checkNodes("at boot", "")
	if got, want := topo(), "cpu0 0 0 0\ncpu1 0 1 1"; got != want {
		t.Errorf("at boot: guest topology (cpu socket core siblings)\n%s\nwant\n%s", got, want)
	}
	if _, err := sup.Resize(ctx, "topo", supervisor.ResizeOptions{CPUs: 3}); err != nil {
		t.Fatal(err)
	}
	want := "cpu0 0 0 0\ncpu1 0 1 1\ncpu2 1 0 2"
	var got string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		if got = topo(); got == want {
			break
		}
	}
	if got != want {
		t.Errorf("after a vCPU hotplug: guest topology\n%s\nwant\n%s (the third vCPU is socket 1's first core)", got, want)
	}
	pinned(t, ctx, sup, []int{1, 0, 1})
	checkNodes("after a vCPU hotplug", "2")

	// Another pinning in the file is applied live.
	body = strings.NewReplacer("cpus = 2\n", "cpus = 3\n", "vcpus = [1, 0, 1, 0]", "vcpus = [0, 1, 0, 1]").Replace(body)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if f, err = spec.Load(path); err != nil {
		t.Fatal(err)
	}
	res, err := sup.Apply(ctx, f, supervisor.ApplyOptions{})
	if err != nil {
		t.Fatalf("apply of another pinning: %v (%+v)", err, res)
	}
	pinned(t, ctx, sup, []int{0, 1, 0})
}

// pinned checks that vCPU i's thread may run on want[i] only.
func pinned(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, want []int) {
	t.Helper()
	out, err := sup.QMP(ctx, "topo", []byte(`{"execute":"query-cpus-fast"}`), false)
	if err != nil {
		t.Fatal(err)
	}
	type vcpu struct {
		CPUIndex int `json:"cpu-index"`
		ThreadID int `json:"thread-id"`
	}
	var reply struct {
		Return []vcpu `json:"return"`
	}
	if err := json.Unmarshal(out, &reply); err != nil { // the reply, or its "return" alone
		if err := json.Unmarshal(out, &reply.Return); err != nil {
			t.Fatalf("query-cpus-fast: %v: %s", err, out)
		}
	}
	if len(reply.Return) != len(want) {
		t.Fatalf("%d vCPUs run, want %d", len(reply.Return), len(want))
	}
	tids, err := affinity.OurTIDs(qemuPID(t, "topo"))
	if err != nil {
		t.Fatal(err)
	}
	// A thread running several vCPUs (single-threaded TCG, as a VM that
	// can hot-plug vCPUs runs) may run on the CPUs of all of them.
	shared := map[int][]int{}
	for _, v := range reply.Return {
		if !slices.Contains(shared[v.ThreadID], want[v.CPUIndex]) {
			shared[v.ThreadID] = append(shared[v.ThreadID], want[v.CPUIndex])
		}
	}
	for _, v := range reply.Return {
		got, err := affinity.Of(tids[v.ThreadID])
		if err != nil {
			t.Fatal(err)
		}
		w := slices.Sorted(slices.Values(shared[v.ThreadID]))
		if !slices.Equal(got, w) {
			t.Errorf("vCPU %d (thread %d) may run on host CPUs %v, want %v", v.CPUIndex, v.ThreadID, got, w)
		}
	}
}

// qemuPID finds VM name's QEMU as this process sees it (systemd may run in
// another PID namespace: its MainPID is not ours).
func qemuPID(t *testing.T, name string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(b), "\x00-name\x00guest="+name+",") {
			pid, _ := strconv.Atoi(e.Name())
			return pid
		}
	}
	t.Fatalf("no QEMU of VM %s", name)
	return 0
}
