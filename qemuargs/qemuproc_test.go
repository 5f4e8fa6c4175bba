package qemuargs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
)

// qemuProc is a QEMU the test started; only it is ever killed, by its pid.
type qemuProc struct {
	t       *testing.T
	argv    []string
	cmd     *exec.Cmd
	out     bytes.Buffer
	exited  chan struct{}
	waitErr error
}

// startQEMU runs argv with extra arguments appended ("-S" to stop before the
// guest runs) and returns it with a negotiated QMP connection on qmpSocket.
func startQEMU(ctx context.Context, t *testing.T, argv []string, qmpSocket string, extra ...string) (*qemuProc, *rawQMP) {
	p := launchQEMU(t, argv, extra...)
	q, err := dialQMP(ctx, qmpSocket, p.exited)
	if err != nil {
		p.fail("%v", err)
	}
	t.Cleanup(func() { q.Close() })
	if err := q.run("qmp_capabilities", nil, nil); err != nil {
		p.fail("%v", err)
	}
	return p, q
}

// launchQEMU starts argv with extra arguments appended; the test's
// cleanup kills it if it still runs.
func launchQEMU(t *testing.T, argv []string, extra ...string) *qemuProc {
	p := &qemuProc{t: t, argv: argv, exited: make(chan struct{})}
	p.cmd = exec.Command(argv[0], append(argv[1:len(argv):len(argv)], extra...)...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if os.Geteuid() == 0 {
		// A network namespace of its own: tap NICs make QEMU create their
		// taps, which must never appear on the host.
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waitErr = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(p.kill)
	return p
}

func (p *qemuProc) kill() {
	select {
	case <-p.exited:
	default:
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// fail stops QEMU and fails the test with its output and argv.
func (p *qemuProc) fail(format string, args ...any) {
	p.t.Helper()
	p.kill()
	p.t.Fatalf("%s\nQEMU output:\n%s\nargv:\n%s", fmt.Sprintf(format, args...), p.out.String(), strings.Join(p.argv, "\n"))
}

// quit sends quit and waits for a clean exit. A guest that powered itself
// off may have made QEMU exit already; that is a clean exit too.
func (p *qemuProc) quit(ctx context.Context, q *rawQMP) {
	p.t.Helper()
	qerr := q.run("quit", nil, nil)
	select {
	case <-p.exited:
		if p.waitErr != nil {
			p.t.Fatalf("QEMU exited with %v after quit\n%s", p.waitErr, p.out.String())
		}
	case <-ctx.Done():
		p.fail("QEMU did not exit after quit (%v)", qerr)
	}
}

// checkInQEMU runs argv with -S and inspects the stopped VM over QMP.
func checkInQEMU(t *testing.T, argv []string, o Options) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, q := startQEMU(ctx, t, argv, o.QMPSocket, "-S")
	var status struct{ Status string }
	want := "prelaunch"
	if o.Incoming {
		want = "inmigrate" // waiting for migrate-incoming
	}
	if err := q.run("query-status", nil, &status); err != nil || status.Status != want {
		p.fail("query-status: %q, %v; want %s", status.Status, err, want)
	}
	var kvm struct{ Enabled bool }
	if err := q.run("query-kvm", nil, &kvm); err != nil || kvm.Enabled != (o.Accel == spec.AccelKVM) {
		p.fail("query-kvm: enabled=%v, %v; accel is %s", kvm.Enabled, err, o.Accel)
	}
	if err := checkState(q, argv); err != nil {
		p.fail("%v", err)
	}
	if err := checkVNC(q, o); err != nil {
		p.fail("%v", err)
	}
	p.quit(ctx, q)
}

// argvObject decodes the JSON value following each occurrence of opt.
func argvObjects[T any](argv []string, opt string) ([]T, error) {
	var out []T
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] != opt {
			continue
		}
		var v T
		if err := json.Unmarshal([]byte(argv[i+1]), &v); err != nil {
			return nil, fmt.Errorf("%s %s: %v", opt, argv[i+1], err)
		}
		out = append(out, v)
	}
	return out, nil
}

// checkState compares QEMU's devices, block nodes and chardevs with argv.
func checkState(q *rawQMP, argv []string) error {
	devices, err := argvObjects[Device](argv, "-device")
	if err != nil {
		return err
	}
	var props []struct{ Name string }
	if err := q.run("qom-list", map[string]string{"path": "/machine/peripheral"}, &props); err != nil {
		return err
	}
	have := map[string]bool{}
	for _, p := range props {
		have[p.Name] = true
	}
	for _, d := range devices {
		if !have[d.ID] {
			return fmt.Errorf("device %q (%s) is not in /machine/peripheral", d.ID, d.Driver)
		}
	}

	// Placement: every device on its bus (QOM path ends in /BUS) and, where
	// the argv gives one, at its PCI address (devfn = slot<<3 | function).
	// query-pci cannot show this before the firmware numbers the buses.
	for _, d := range devices {
		path := "/machine/peripheral/" + d.ID
		var bus string
		if err := q.run("qom-get", map[string]string{"path": path, "property": "parent_bus"}, &bus); err != nil {
			return err
		}
		if d.Bus != "" && !strings.HasSuffix(bus, "/"+d.Bus) {
			return fmt.Errorf("device %q is on bus %q, want %q", d.ID, bus, d.Bus)
		}
		if d.Addr == "" {
			continue
		}
		var slot, fn int
		if n, _ := fmt.Sscanf(d.Addr, "0x%x.0x%x", &slot, &fn); n == 0 {
			return fmt.Errorf("device %q: bad addr %q", d.ID, d.Addr)
		}
		var devfn int
		if err := q.run("qom-get", map[string]string{"path": path, "property": "addr"}, &devfn); err != nil {
			return err
		}
		if devfn != slot<<3|fn {
			return fmt.Errorf("device %q is at devfn %#x, want %s (%#x)", d.ID, devfn, d.Addr, slot<<3|fn)
		}
	}

	blockdevs, err := argvObjects[Blockdev](argv, "-blockdev")
	if err != nil {
		return err
	}
	var nodes []struct {
		NodeName string `json:"node-name"`
		RO       bool   `json:"ro"`
	}
	if err := q.run("query-named-block-nodes", nil, &nodes); err != nil {
		return err
	}
	ro := map[string]bool{}
	for _, n := range nodes {
		ro[n.NodeName] = n.RO
	}
	for _, b := range blockdevs {
		r, ok := ro[b.NodeName]
		if !ok {
			return fmt.Errorf("block node %q is not in query-named-block-nodes", b.NodeName)
		}
		if r != b.ReadOnly {
			return fmt.Errorf("block node %q: ro=%v, want %v", b.NodeName, r, b.ReadOnly)
		}
	}

	var chardevs []struct{ Label string }
	if err := q.run("query-chardev", nil, &chardevs); err != nil {
		return err
	}
	labels := map[string]bool{}
	for _, c := range chardevs {
		labels[c.Label] = true
	}
	for i, a := range argv {
		if a == "-chardev" && i+1 < len(argv) {
			id := strings.SplitN(strings.SplitN(argv[i+1], "id=", 2)[1], ",", 2)[0]
			if !labels[id] {
				return fmt.Errorf("chardev %q is not in query-chardev", id)
			}
		}
	}
	return nil
}
