package hotplug

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// The engine's one attach, detach and recovery, on a stand-in kind of
// device whose every call is logged, a real environment (machine.Env) on a
// state root in a temporary directory and a stand-in QEMU (which devices
// it has, whether its guest releases one): no VM.

const testVM = "web"

// world is one test's VM: its records, its QEMU and what was done.
type world struct {
	t     *testing.T
	store vmstore.Store
	k     *operation.Kernel
	e     *Engine
	// QEMU: nil when none runs; the devices it has; whether the guest
	// lets a device go when asked.
	qemu    map[string]bool
	release bool
	log     []string // the device's calls and the journal's steps, in order
	failAt  string   // the step that fails
}

func newWorld(t *testing.T) *world {
	w := &world{t: t, qemu: map[string]bool{}}
	env := newEnv(t, func(_, step string) { w.log = append(w.log, "step "+step) })
	w.store, w.k, w.e = env.State(), env.Ops(), New(env)
	w.e.mon = fakeMonitor{w}
	w.e.query = func(context.Context, *qmp.Conn) (qdev.Present, error) {
		return qdev.Present{Devices: maps.Clone(w.qemu)}, nil
	}
	w.e.finish = func(_ context.Context, _ *qmp.Conn, id string, _ time.Duration) (bool, error) {
		w.log = append(w.log, "finish-unplug "+id)
		if w.release {
			delete(w.qemu, id)
		}
		return !w.qemu[id], nil
	}
	kd := fakeKind(w)
	w.k.Register(kd.attach, w.e.recoverAttach(kd))
	w.k.Register(kd.detach, w.e.recoverDetach(kd))
	vm := &spec.VM{Name: testVM, Machine: "pc", CPUs: 1, Memory: 256 * spec.MiB}
	if err := w.store.WriteApplied(&vmstore.Applied{Name: testVM, Spec: vmstore.Canonical(vm)}, []byte("name = \"web\"\n")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(w.store.Paths(testVM).Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	w.run(true)
	return w
}

// run says whether QEMU runs (its monitor socket exists).
func (w *world) run(on bool) {
	p := w.store.Paths(testVM).QMP
	if !on {
		os.Remove(p)
		w.qemu = nil
		return
	}
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		w.t.Fatal(err)
	}
	if w.qemu == nil {
		w.qemu = map[string]bool{}
	}
}

// recorded reports whether the record holds the device (the stand-in kind
// records itself as an attached NIC).
func (w *world) recorded() bool {
	app, err := w.store.ReadApplied(testVM)
	if err != nil {
		w.t.Fatal(err)
	}
	return hasNIC(app, "x")
}

// killed leaves an operation of kind as its command would if killed after
// done.
func (w *world) killed(kind operation.Kind, done ...string) {
	o, err := w.k.Begin(context.Background(), testVM, kind, fakeIntent{Name: "x"})
	if err != nil {
		w.t.Fatal(err)
	}
	for _, s := range done {
		o.Step(operation.Step(s))
	}
	o.Close()
	w.log = nil
}

// settle is the next command on the VM: it settles what was left.
func (w *world) settle() string {
	note, err := w.k.Settle(context.Background(), testVM, "status")
	if err != nil {
		w.t.Fatal(err)
	}
	if o, _ := w.k.Pending(testVM); o != nil {
		o.Close()
		w.t.Fatal("the journal was left after a recovery")
	}
	return strings.TrimPrefix(note, "recovered an interrupted ")
}

// newEnv is a real environment on a temporary state root (it connects to
// systemd only when asked, which these tests never do).
func newEnv(t *testing.T, after func(vm, step string)) *machine.Env {
	env, err := machine.New(machine.Options{Root: t.TempDir(), UnplugTimeout: time.Second, AfterStep: after})
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// fakeMonitor is the stand-in QEMU's monitor: none when it does not run.
type fakeMonitor struct{ w *world }

func (m fakeMonitor) QMPSession(context.Context, string) (*qmp.Conn, func(), error) {
	if m.w.qemu == nil {
		return nil, nil, machine.ErrNotRunning
	}
	return new(qmp.Conn), func() {}, nil
}

type fakeIntent struct {
	Name string `json:"name"`
}

func fakeKind(w *world) kind {
	return kind{attach: "fake-attach", detach: "fake-detach", load: func(_ *Engine, _ string, o *operation.Op) (Device, error) {
		in, err := operation.IntentOf[fakeIntent](o)
		return &fakeDevice{w: w, in: in}, err
	}}
}

// fakeDevice is a device whose device id is "dev-NAME" and whose other
// part in QEMU is "part-NAME".
type fakeDevice struct {
	w  *world
	in fakeIntent
}

func (d *fakeDevice) did(what string) error {
	d.w.log = append(d.w.log, what)
	if what == d.w.failAt {
		return errors.New(what + " failed")
	}
	return nil
}

func (d *fakeDevice) Label() string { return fmt.Sprintf("fake %q", d.in.Name) }
func (d *fakeDevice) Step(s operation.Step) operation.Step {
	return operation.Step(d.in.Name+": ") + s
}
func (d *fakeDevice) Intent() any { return d.in }
func (d *fakeDevice) ID() string  { return "dev-" + d.in.Name }
func (d *fakeDevice) Recorded(app *vmstore.Applied) bool {
	return hasNIC(app, d.in.Name)
}

func (d *fakeDevice) Record(app *vmstore.Applied, pr *qdev.Present) error {
	d.w.log = append(d.w.log, fmt.Sprintf("record (from QEMU %v)", pr != nil))
	return recordNIC(app, spec.NIC{Name: d.in.Name}, false)
}

func (d *fakeDevice) Forget(app *vmstore.Applied) error {
	d.w.log = append(d.w.log, "forget")
	return dropNIC(app, d.in.Name)
}

func (d *fakeDevice) Unplug(context.Context, *qmp.Conn) error {
	if err := d.did("unplug"); err != nil {
		return err
	}
	delete(d.w.qemu, d.ID())
	delete(d.w.qemu, "part-"+d.in.Name)
	return nil
}

func (d *fakeDevice) RemoveParts(_ context.Context, _ *qmp.Conn, pr qdev.Present) error {
	var have []string
	for _, id := range []string{d.ID(), "part-" + d.in.Name} {
		if pr.Devices[id] {
			have = append(have, id)
			delete(d.w.qemu, id)
		}
	}
	return d.did(fmt.Sprintf("remove-parts %v", have))
}

func (d *fakeDevice) Release(context.Context) error { return d.did("release") }

func (d *fakeDevice) Undo(context.Context) (string, error) { return "undone", d.did("undo") }

func (d *fakeDevice) step(name string, qemu ...string) steps.Step {
	return steps.Step{Name: string(d.Step(operation.Step(name))), Do: func(context.Context) error {
		if err := d.did(name); err != nil {
			return err
		}
		for _, id := range qemu {
			d.w.qemu[id] = true
		}
		return nil
	}, Undo: func(context.Context) {
		d.w.log = append(d.w.log, "undo "+name)
		for _, id := range qemu {
			delete(d.w.qemu, id)
		}
	}}
}

func (d *fakeDevice) HostSteps(*operation.Op) []steps.Step {
	return []steps.Step{d.step("prepare"), d.step("grant")}
}

func (d *fakeDevice) Parts() ([]steps.Step, error) {
	if err := d.did("parts"); err != nil {
		return nil, err
	}
	return []steps.Step{d.step("part-add", "part-"+d.in.Name), d.step("device-add", d.ID())}, nil
}

// fakeRequest attaches or detaches the stand-in device "x".
type fakeRequest struct{ w *world }

func (r fakeRequest) kind() kind           { return fakeKind(r.w) }
func (r fakeRequest) fail(err error) error { return err }

func (r fakeRequest) check(_ context.Context, _ *vmstore.View, down error) (bool, error) {
	return false, down
}

func (r fakeRequest) plug(context.Context, *vmstore.View, *qmp.Conn, string) (Plug, error) {
	return &fakeDevice{w: r.w, in: fakeIntent{Name: "x"}}, nil
}

func (r fakeRequest) find(_ context.Context, v *vmstore.View, down error) (Device, error) {
	if down != nil {
		return nil, down
	}
	if !hasNIC(v.Applied, "x") {
		return nil, errors.New("no such device")
	}
	return &fakeDevice{w: r.w, in: fakeIntent{Name: "x"}}, nil
}

// TestAttach: the host steps, then the parts, then the record, each
// journaled as it is done; a failure undoes what was done before it, in
// reverse, and records nothing; the journal ends either way; a VM not
// running is refused before anything is done.
func TestAttach(t *testing.T) {
	for _, c := range []struct {
		failAt   string
		want     []string
		recorded bool
		qemu     []string
	}{
		{"", []string{"prepare", "step x: prepare", "grant", "step x: grant", "parts", "part-add", "step x: part-add",
			"device-add", "step x: device-add", "record (from QEMU false)", "step x: record"}, true, []string{"dev-x", "part-x"}},
		{"grant", []string{"prepare", "step x: prepare", "grant", "undo prepare"}, false, nil},
		{"parts", []string{"prepare", "step x: prepare", "grant", "step x: grant", "parts", "undo grant", "undo prepare"}, false, nil},
		{"device-add", []string{"prepare", "step x: prepare", "grant", "step x: grant", "parts", "part-add", "step x: part-add",
			"device-add", "undo part-add", "undo grant", "undo prepare"}, false, nil},
	} {
		t.Run("fail at "+c.failAt, func(t *testing.T) {
			w := newWorld(t)
			w.failAt = c.failAt
			err := w.e.attach(context.Background(), testVM, fakeRequest{w})
			if (err != nil) != (c.failAt != "") {
				t.Fatalf("attach: %v", err)
			}
			if diff := cmp.Diff(c.want, w.log); diff != "" {
				t.Errorf("calls and steps (-want +got):\n%s", diff)
			}
			if w.recorded() != c.recorded {
				t.Errorf("recorded %v, want %v", w.recorded(), c.recorded)
			}
			if got := slices.Sorted(maps.Keys(w.qemu)); !slices.Equal(got, c.qemu) {
				t.Errorf("QEMU has %v, want %v", got, c.qemu)
			}
			if o, _ := w.k.Pending(testVM); o != nil {
				o.Close()
				t.Error("the journal was left")
			}
		})
	}
	w := newWorld(t)
	w.run(false)
	if err := w.e.attach(context.Background(), testVM, fakeRequest{w}); !errors.Is(err, machine.ErrNotRunning) || len(w.log) != 0 {
		t.Errorf("attach to a VM shut off: %v, %q", err, w.log)
	}
}

// TestDetach: the guest lets the device go and its parts go, then its host
// side, then the record; a guest that keeps it leaves everything as it was.
func TestDetach(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	if err := w.e.attach(ctx, testVM, fakeRequest{w}); err != nil {
		t.Fatal(err)
	}
	w.log, w.failAt = nil, "unplug"
	if err := w.e.detach(ctx, testVM, fakeRequest{w}); err == nil || !w.recorded() || len(w.qemu) != 2 {
		t.Fatalf("a guest that keeps the device: %v, recorded %v, QEMU %v", err, w.recorded(), w.qemu)
	}
	w.log, w.failAt = nil, ""
	if err := w.e.detach(ctx, testVM, fakeRequest{w}); err != nil {
		t.Fatal(err)
	}
	want := []string{"unplug", "step x: unplugged", "release", "step x: released", "forget"}
	if diff := cmp.Diff(want, w.log); diff != "" {
		t.Errorf("calls and steps (-want +got):\n%s", diff)
	}
	if w.recorded() || len(w.qemu) != 0 {
		t.Errorf("after the detach: recorded %v, QEMU %v", w.recorded(), w.qemu)
	}
	if err := w.e.detach(ctx, testVM, fakeRequest{w}); err == nil || !strings.Contains(err.Error(), "no such device") {
		t.Errorf("a second detach: %v", err)
	}
}

// TestRecoverAttach: an attach killed anywhere is settled from the record
// and QEMU: recorded, it is done; in the guest, it is adopted; else its
// parts in QEMU and its host side are removed.
func TestRecoverAttach(t *testing.T) {
	for _, c := range []struct {
		name     string
		recorded bool
		qemu     []string // nil: QEMU is gone
		note     string
		want     []string
		adopted  bool
	}{
		{"recorded", true, []string{"dev-x", "part-x"}, `fake "x" was attached and recorded`, nil, true},
		{"in the guest", false, []string{"dev-x", "part-x"}, `fake "x" was plugged: adopted and recorded`, []string{"record (from QEMU true)"}, true},
		{"parts only", false, []string{"part-x"}, `fake "x" had not reached the guest: undone`, []string{"remove-parts [part-x]", "undo"}, false},
		{"nothing in QEMU", false, []string{}, `fake "x" had not reached the guest: undone`, []string{"remove-parts []", "undo"}, false},
		{"QEMU gone", false, nil, `fake "x" had not reached the guest: undone`, []string{"undo"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t)
			if c.recorded {
				recordFake(t, w)
			}
			w.killed("fake-attach", "x: prepare")
			setQEMU(w, c.qemu)
			if note := w.settle(); note != "fake-attach: "+c.note {
				t.Errorf("note %q, want %q", note, c.note)
			}
			if diff := cmp.Diff(c.want, w.log); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			if w.recorded() != c.adopted {
				t.Errorf("recorded %v, want %v", w.recorded(), c.adopted)
			}
		})
	}
}

// TestRecoverDetach: a detach killed anywhere is settled from the record
// and QEMU: no longer recorded, it is done; a device still in the guest is
// asked for again, and stays if the guest keeps it; one that left has its
// parts, host side and record removed.
func TestRecoverDetach(t *testing.T) {
	for _, c := range []struct {
		name     string
		recorded bool
		qemu     []string
		release  bool
		note     string
		want     []string
		left     bool // still recorded
	}{
		{"not recorded", false, []string{}, false, `fake "x" was detached and recorded`, nil, false},
		{"guest releases it", true, []string{"dev-x", "part-x"}, true, `fake "x" had left the guest: detach finished`,
			[]string{"finish-unplug dev-x", "remove-parts [part-x]", "release", "forget"}, false},
		{"guest keeps it", true, []string{"dev-x", "part-x"}, false,
			`fake "x" is still in the guest (it did not release it): it stays attached; detach it again`, []string{"finish-unplug dev-x"}, true},
		{"device gone", true, []string{"part-x"}, false, `fake "x" had left the guest: detach finished`,
			[]string{"remove-parts [part-x]", "release", "forget"}, false},
		{"QEMU gone", true, nil, false, `fake "x" had left the guest: detach finished`, []string{"release", "forget"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t)
			if c.recorded {
				recordFake(t, w)
			}
			w.killed("fake-detach")
			setQEMU(w, c.qemu)
			w.release = c.release
			if note := w.settle(); note != "fake-detach: "+c.note {
				t.Errorf("note %q, want %q", note, c.note)
			}
			if diff := cmp.Diff(c.want, w.log); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			if w.recorded() != c.left {
				t.Errorf("recorded %v, want %v", w.recorded(), c.left)
			}
		})
	}
}

func recordFake(t *testing.T, w *world) {
	app, err := w.store.ReadApplied(testVM)
	if err != nil {
		t.Fatal(err)
	}
	app.AttachedNICs = append(app.AttachedNICs, spec.NIC{Name: "x"})
	if err := w.store.RewriteApplied(app); err != nil {
		t.Fatal(err)
	}
}

func setQEMU(w *world, ids []string) {
	if ids == nil {
		w.run(false)
		return
	}
	w.run(true)
	for _, id := range ids {
		w.qemu[id] = true
	}
}

// TestKinds: the kinds register under the journal names the supervisor
// wrote before the engine, and read back the intents it wrote.
func TestKinds(t *testing.T) {
	env := newEnv(t, nil)
	lifecycle := env.Ops().Kinds()
	New(env).Register()
	want := []operation.Kind{"disk-attach", "disk-detach", "hostdev-attach", "hostdev-detach", "nic-attach", "nic-detach"}
	got := slices.DeleteFunc(env.Ops().Kinds(), func(k operation.Kind) bool { return slices.Contains(lifecycle, k) })
	if !slices.Equal(got, want) {
		t.Errorf("kinds %q, want %q", got, want)
	}
	store := vmstore.Store{Root: t.TempDir()}
	for _, c := range []struct {
		kind          kind
		intent        string // as the supervisor journaled it before the engine
		label, id     string
		step, stepWas string
	}{
		{diskKind(), `{"disk":{"name":"fd","type":"file","file":"/img/fd.qcow2"},"bus":"rp1","new_image":true,"devices":["disk-fd"],"nodes":["fd-fmt","fd-file"],"objects":[],"rules":["/img/fd.qcow2"]}`,
			`disk "fd"`, "disk-fd", "unplugged", `disk "fd": unplugged`},
		{nicKind(), `{"nic":{"name":"fn","type":"bridge"},"bus":"rp2","netdev":"net-fn","device":"nic-fn"}`,
			`nic "fn"`, "nic-fn", "tap", `nic "fn": tap`},
		{hostDevKind(), `{"dev":{"address":"0000:01:00.0","name":"gpu"},"bus":"rp3","device":"hostdev-gpu","nodes":["/dev/vfio/7"],"grants":["/dev/vfio/vfio","/dev/vfio/7"]}`,
			"host device 0000:01:00.0", "hostdev-gpu", "bind", "bind"},
	} {
		j, err := store.BeginOp(testVM, string(c.kind.attach), rawIntent(c.intent))
		if err != nil {
			t.Fatal(err)
		}
		j.Close()
		o, err := operation.New(operation.Options{Store: store}).Pending(testVM)
		if err != nil {
			t.Fatal(err)
		}
		d, err := c.kind.load(New(env), testVM, o)
		o.Close()
		if err != nil {
			t.Fatalf("%s: %v", c.kind.attach, err)
		}
		if d.Label() != c.label || d.ID() != c.id || string(d.Step(operation.Step(c.step))) != c.stepWas {
			t.Errorf("%s: label %q, id %q, step %q", c.kind.attach, d.Label(), d.ID(), d.Step(operation.Step(c.step)))
		}
		if j, _ := store.PendingOp(testVM); j != nil {
			j.End()
		}
	}
}

type rawIntent string

func (r rawIntent) MarshalJSON() ([]byte, error) { return []byte(r), nil }
