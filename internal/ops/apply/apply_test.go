package apply

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/ops/plan"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// The recoveries of apply's own operations (a setting's change, a resize)
// and what apply does with the changes it cannot make live, on a real
// environment (machine.Env) on a state root in a temporary directory, a
// stand-in unit and QEMU: no VM.

const testVM = "web"

// world is one test's VM: its record, whether a QEMU runs it, what QEMU
// says it has, and what was asked of the host.
type world struct {
	t     *testing.T
	store vmstore.Store
	k     *operation.Kernel
	a     *Applier
	// QEMU's vCPUs and memory (actual), or the error its answer is.
	cpus   int
	mem    spec.Size
	qmpErr error
	log    []string
}

func newWorld(t *testing.T, vm *spec.VM) *world {
	env, err := machine.New(machine.Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, store: env.State(), k: env.Ops(), a: New(env)}
	w.a.unit = fakeUnit{w}
	w.a.actual = func(context.Context, *qmp.Conn) (int, spec.Size, error) { return w.cpus, w.mem, w.qmpErr }
	w.a.Register()
	vm.Name = testVM
	vm.FillDefaults()
	app := &vmstore.Applied{Name: testVM, SourceFile: "/etc/vmsup/web.toml", Spec: vmstore.Canonical(vm)}
	// The file it started from, as AppliedSpec reads it back (autostart).
	raw := "name = \"web\"\nmemory = \"1G\"\n\n[boot]\nkernel = \"/boot/vmlinuz\"\n"
	if err := w.store.WriteApplied(app, []byte(raw)); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(w.store.Paths(testVM).Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	w.cpus, w.mem = vm.CPUs, vm.Memory
	w.run(true)
	return w
}

// run says whether QEMU runs (its monitor socket exists).
func (w *world) run(on bool) {
	p := w.store.Paths(testVM).QMP
	if !on {
		os.Remove(p)
		return
	}
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) applied() *vmstore.Applied {
	app, err := w.store.ReadApplied(testVM)
	if err != nil {
		w.t.Fatal(err)
	}
	return app
}

func (w *world) recorded() *spec.VM {
	vm, err := w.applied().VM()
	if err != nil {
		w.t.Fatal(err)
	}
	return vm
}

// killed leaves an operation as its command would if killed after done.
func (w *world) killed(kind operation.Kind, intent any, done ...operation.Step) {
	o, err := w.k.Begin(context.Background(), testVM, kind, intent)
	if err != nil {
		w.t.Fatal(err)
	}
	for _, s := range done {
		o.Step(s)
	}
	o.Close()
}

// settle is the next command on the VM. pending says whether the journal
// is still there after it (a recovery that failed leaves it).
func (w *world) settle() (note string, pending bool, err error) {
	note, err = w.k.Settle(context.Background(), testVM, "status")
	o, perr := w.k.Pending(testVM)
	if perr != nil {
		w.t.Fatal(perr)
	}
	if o != nil {
		o.Close()
	}
	return strings.TrimPrefix(note, "recovered an interrupted "), o != nil, err
}

// fakeUnit is the stand-in VM's unit and QEMU: what was asked of the unit
// is logged; QEMU's monitor is there while it runs.
type fakeUnit struct{ w *world }

func (u fakeUnit) QMPSession(context.Context, string) (*qmp.Conn, func(), error) {
	if _, err := os.Stat(u.w.store.Paths(testVM).QMP); err != nil {
		return nil, nil, vmstore.ErrNotRunning
	}
	if u.w.qmpErr != nil {
		return nil, nil, u.w.qmpErr
	}
	return new(qmp.Conn), func() {}, nil
}

func (u fakeUnit) SetUnitLimits(_ context.Context, vm string, l units.Limits) error {
	u.w.log = append(u.w.log, fmt.Sprintf("limits %s quota=%d weight=%d memory=%d tasks=%d", vm, *l.CPUQuota, *l.CPUWeight, *l.MemoryMax, *l.TasksMax))
	return nil
}

func (u fakeUnit) Enable(_ context.Context, files ...*spec.File) ([]machine.EnableResult, error) {
	for _, f := range files {
		u.w.log = append(u.w.log, "enable "+f.Path)
	}
	return nil, nil
}

func (u fakeUnit) Disable(_ context.Context, names ...string) error {
	u.w.log = append(u.w.log, "disable "+strings.Join(names, " "))
	return nil
}

// TestJournalNames: the kinds, steps and intents apply journals are what
// earlier vmsup versions wrote, so their journals still recover.
func TestJournalNames(t *testing.T) {
	got := map[string]string{"apply-set": string(opApplySet), "set": string(opResize),
		"cpus": string(stepResizeCPUs), "memory": string(stepResizeMemory)}
	for want, g := range got {
		if g != want {
			t.Errorf("journal name %q, want %q", g, want)
		}
	}
	// A setting's intent as vmsup wrote it before apply left the supervisor.
	old := `{"change":{"field":"description","from":"a","to":"b","class":"live","kind":"record"},"want":{"name":"web"}}`
	var in setIntent
	if err := json.Unmarshal([]byte(old), &in); err != nil || in.Change.Kind != plan.RecordOnly || string(in.Want) != `{"name":"web"}` {
		t.Errorf("old intent: %+v, %v", in, err)
	}
	b, err := json.Marshal(setIntent{Change: plan.Change{Field: "cpus", Class: plan.Live}, Want: json.RawMessage(`{}`)})
	if err != nil || string(b) != `{"change":{"field":"cpus","class":"live"},"want":{}}` {
		t.Errorf("intent written: %s, %v", b, err)
	}
	// A resize's intent is its options, by their Go names.
	b, err = json.Marshal(ResizeOptions{CPUs: 2, Memory: spec.GiB})
	if err != nil || string(b) != `{"CPUs":2,"Memory":"1G","CPUQuota":null,"CPUWeight":null}` {
		t.Errorf("resize intent: %s, %v", b, err)
	}
}

// TestRecoverResize: a resize whose command died records what QEMU has,
// whatever of the resize got there; with QEMU gone there is nothing to
// record; a QEMU that does not answer leaves the journal for later.
func TestRecoverResize(t *testing.T) {
	for _, tc := range []struct {
		name      string
		running   bool
		resized   *vmstore.Resized // recorded before
		cpus      int
		mem       spec.Size
		qmpErr    error
		note      string
		pending   bool
		want      *vmstore.Resized
		wantError string
	}{
		{name: "QEMU gone", resized: &vmstore.Resized{CPUs: 3, Memory: 2 * spec.GiB},
			note: "set: QEMU is gone: nothing to reconcile", want: &vmstore.Resized{CPUs: 3, Memory: 2 * spec.GiB}},
		{name: "nothing got there", running: true, cpus: 2, mem: spec.GiB,
			note: "set: recorded what QEMU has: 2 vCPUs, 1G"},
		{name: "back to what it booted with", running: true, resized: &vmstore.Resized{CPUs: 3, Memory: spec.GiB},
			cpus: 2, mem: spec.GiB, note: "set: recorded what QEMU has: 2 vCPUs, 1G"},
		{name: "the vCPUs got there", running: true, cpus: 4, mem: spec.GiB,
			note: "set: recorded what QEMU has: 4 vCPUs, 1G", want: &vmstore.Resized{CPUs: 4, Memory: spec.GiB}},
		{name: "a DIMM got there", running: true, cpus: 2, mem: 3 * spec.GiB,
			note: "set: recorded what QEMU has: 2 vCPUs, 3G", want: &vmstore.Resized{CPUs: 2, Memory: 3 * spec.GiB}},
		{name: "QEMU does not answer", running: true, resized: &vmstore.Resized{CPUs: 3, Memory: spec.GiB},
			qmpErr: errors.New("query-hotpluggable-cpus: timeout"), pending: true,
			want: &vmstore.Resized{CPUs: 3, Memory: spec.GiB}, wantError: "timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, &spec.VM{CPUs: 2, MaxCPUs: 4, Memory: spec.GiB, MaxMemory: 4 * spec.GiB})
			app := w.applied()
			app.Resized = tc.resized
			if err := w.store.RewriteApplied(app); err != nil {
				t.Fatal(err)
			}
			w.killed(opResize, ResizeOptions{CPUs: 4}, stepResizeCPUs)
			w.run(tc.running)
			w.cpus, w.mem, w.qmpErr = tc.cpus, tc.mem, tc.qmpErr
			note, pending, err := w.settle()
			if tc.wantError == "" && err != nil || tc.wantError != "" && (err == nil || !strings.Contains(err.Error(), tc.wantError)) {
				t.Fatalf("settle: %v, want an error with %q", err, tc.wantError)
			}
			if note != tc.note || pending != tc.pending {
				t.Errorf("note %q, journal left %v; want %q, %v", note, pending, tc.note, tc.pending)
			}
			if diff := cmp.Diff(tc.want, w.applied().Resized); diff != "" {
				t.Errorf("recorded resize (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRecoverApplySet: a setting's change whose command died is made
// again from its intent and recorded; with QEMU gone there is nothing to
// set; one QEMU cannot be asked about stays journaled.
func TestRecoverApplySet(t *testing.T) {
	booted := spec.VM{CPUs: 1, Memory: spec.GiB, MaxMemory: 2 * spec.GiB, Description: "old",
		Disks: []spec.Disk{{Name: "data", Type: spec.DiskFile, File: "/img/data.qcow2", Size: spec.GiB}}}
	for _, tc := range []struct {
		name    string
		running bool
		change  plan.Change
		want    func(vm *spec.VM) // the file's VM, from booted
		note    string
		log     []string
		pending bool
		// check the record after
		recorded func(vm *spec.VM) string
	}{
		{name: "QEMU gone", change: plan.Change{Field: "description", Kind: plan.RecordOnly},
			want: func(vm *spec.VM) { vm.Description = "new" }, note: "apply-set: QEMU is gone: nothing to set",
			recorded: func(vm *spec.VM) string { return vm.Description }},
		{name: "record only", running: true, change: plan.Change{Field: "description", Kind: plan.RecordOnly},
			want: func(vm *spec.VM) { vm.Description = "new" }, note: "apply-set: description was set again and recorded",
			recorded: func(vm *spec.VM) string { return vm.Description }},
		{name: "a disk's size vmsup only records", running: true, change: plan.Change{Field: "disk[data].size", Kind: plan.RecordOnly, Name: "data"},
			want: func(vm *spec.VM) { vm.Disks[0].Size = 2 * spec.GiB }, note: "apply-set: disk[data].size was set again and recorded",
			recorded: func(vm *spec.VM) string { return vm.Disks[0].Size.String() }},
		{name: "unit limits", running: true, change: plan.Change{Field: "limits", Kind: plan.UnitLimits},
			want: func(vm *spec.VM) {
				vm.Limits = spec.Limits{CPUQuota: 50, MemoryOverhead: 256 * spec.MiB, TasksMax: 100}
			},
			note: "apply-set: limits was set again and recorded",
			log:  []string{fmt.Sprintf("limits web quota=50 weight=100 memory=%d tasks=100", int64(2*spec.GiB+256*spec.MiB))},
			recorded: func(vm *spec.VM) string {
				return fmt.Sprintf("quota=%d tasks=%d", vm.Limits.CPUQuota, vm.Limits.TasksMax)
			}},
		{name: "autostart on", running: true, change: plan.Change{Field: "autostart", Kind: plan.Autostart},
			want: func(vm *spec.VM) { vm.Autostart = true }, note: "apply-set: autostart was set again and recorded",
			log: []string{"enable /etc/vmsup/web.toml"}, recorded: func(vm *spec.VM) string { return fmt.Sprint(vm.Autostart) }},
		{name: "autostart off", running: true, change: plan.Change{Field: "autostart", Kind: plan.Autostart},
			want: func(vm *spec.VM) {}, note: "apply-set: autostart was set again and recorded",
			log: []string{"disable web"}, recorded: func(vm *spec.VM) string { return fmt.Sprint(vm.Autostart) }},
		{name: "QEMU does not answer", running: true, change: plan.Change{Field: "disk[data].iops", Kind: plan.DiskLimits, Name: "data"},
			want: func(vm *spec.VM) { vm.Disks[0].IOLimits.IOPS = 100 }, pending: true,
			recorded: func(vm *spec.VM) string { return fmt.Sprint(vm.Disks[0].IOLimits.IOPS) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vm := booted
			vm.Disks = append([]spec.Disk(nil), booted.Disks...)
			w := newWorld(t, &vm)
			before := tc.recorded(w.recorded())
			want := *w.recorded()
			want.Disks = append([]spec.Disk(nil), want.Disks...)
			tc.want(&want)
			w.killed(opApplySet, setIntent{Change: tc.change, Want: vmstore.Canonical(&want)})
			w.run(tc.running)
			w.qmpErr = errors.New("no monitor") // the stand-in QEMU answers no QMP
			note, pending, err := w.settle()
			if (err != nil) != tc.pending || note != tc.note || pending != tc.pending {
				t.Fatalf("settle: %q, journal left %v, %v; want %q, %v", note, pending, err, tc.note, tc.pending)
			}
			if diff := cmp.Diff(tc.log, w.log); diff != "" {
				t.Errorf("asked of the host (-want +got):\n%s", diff)
			}
			after, wantAfter := tc.recorded(w.recorded()), tc.recorded(&want)
			if !tc.running || tc.pending {
				wantAfter = before // nothing was set
			}
			if after != wantAfter {
				t.Errorf("recorded %q, want %q", after, wantAfter)
			}
		})
	}
}

// TestDeferral: the changes apply cannot make live go to a restart when
// asked for, to the guest's next reboot when asked for or when none needs
// a restart, else they are left pending.
func TestDeferral(t *testing.T) {
	reboot := plan.Change{Field: "machine.smbios", Class: plan.Reboot}
	restart := plan.Change{Field: "machine", Class: plan.Restart}
	for _, tc := range []struct {
		name string
		rest []plan.Change
		o    Options
		want deferral
	}{
		{"reboot class", []plan.Change{reboot}, Options{}, deferReboot},
		{"restart class", []plan.Change{reboot, restart}, Options{}, deferPending},
		{"restart asked for", []plan.Change{reboot}, Options{Restart: true}, deferRestart},
		{"restart class, restart asked for", []plan.Change{restart}, Options{Restart: true}, deferRestart},
		{"restart class, next reboot asked for", []plan.Change{restart}, Options{AtNextReboot: true}, deferReboot},
	} {
		if got := deferralOf(tc.rest, tc.o); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
