package caps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/qmp"
)

// qemuRun is one QEMU started for the probe with its monitor on a
// socketpair ("-qmp stdio"): no socket file, nothing to clean up, and the
// monitor is there as soon as QEMU answers.
type qemuRun struct {
	cmd    *exec.Cmd
	mon    *qmp.Conn
	stderr *bytes.Buffer
	exited chan struct{}
}

// startQEMU starts binary with args plus the monitor, and connects. An
// error carries QEMU's last words (a QEMU that aborts on -cpu host says why
// on stderr, then dies of SIGABRT).
func startQEMU(ctx context.Context, binary string, args ...string) (*qemuRun, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "qmp"), os.NewFile(uintptr(fds[1]), "qemu-qmp")
	r := &qemuRun{stderr: &bytes.Buffer{}, exited: make(chan struct{})}
	all := append([]string{"-nodefaults", "-no-user-config", "-display", "none", "-S", "-qmp", "stdio"}, args...)
	r.cmd = exec.Command(binary, all...)
	r.cmd.Stdin, r.cmd.Stdout, r.cmd.Stderr = theirs, theirs, &limitedBuffer{b: r.stderr, max: 16 << 10}
	// A probe QEMU ends with the process that asked: a CLI that exits
	// mid-probe (an error elsewhere, Ctrl-C) left it running for good, as
	// QEMU does not quit when its stdio monitor closes.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = r.cmd.Start()
	// Only QEMU holds its end now: its exit is EOF here at once.
	theirs.Close()
	if err != nil {
		ours.Close()
		return nil, err
	}
	go func() { r.cmd.Wait(); close(r.exited) }()
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		r.kill()
		return nil, err
	}
	// QEMU answers in ~50 ms; a loaded host or KVM set-up may take longer,
	// and on an emulated host (a Debian host VM under TCG, issue 48) the
	// qom-list-types that loads every module took over 5 s while its load
	// average said idle: each answer may take as long as the probe may.
	wait := probeWait
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	mon, err := qmp.NewConn(ctx, fc.(*net.UnixConn), "probe", qmp.WithConnectTimeout(wait),
		qmp.WithCommandTimeout(wait))
	if err != nil {
		r.kill()
		if timedOut(err) { // killed by us: QEMU's last words are the kill's
			return nil, fmt.Errorf("QEMU did not answer in time (%w)", err)
		}
		return nil, fmt.Errorf("%s", r.lastWords(err))
	}
	r.mon = mon
	return r, nil
}

// lastWords is QEMU's last stderr line, or how it ended, or err.
func (r *qemuRun) lastWords(err error) string {
	select {
	case <-r.exited:
	case <-time.After(2 * time.Second):
	}
	lines := strings.Split(strings.TrimSpace(r.stderr.String()), "\n")
	var words []string
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" {
			words = append(words, l)
		}
	}
	if len(words) > 2 {
		words = words[len(words)-2:]
	}
	w := strings.Join(words, " / ")
	if st := r.cmd.ProcessState; st != nil {
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			w = strings.TrimPrefix(w+" (killed by "+unix.SignalName(ws.Signal())+")", " ")
		} else if st.ExitCode() > 0 && w == "" {
			w = fmt.Sprintf("exited with status %d", st.ExitCode())
		}
	}
	if w == "" && err != nil {
		w = err.Error()
	}
	return w
}

// stop quits QEMU (kills it if quit does not end it).
func (r *qemuRun) stop() {
	if r.mon != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = r.mon.Quit(ctx)
		cancel()
		r.mon.Close()
	}
	select {
	case <-r.exited:
	case <-time.After(2 * time.Second):
		r.kill()
	}
}

func (r *qemuRun) kill() {
	_ = r.cmd.Process.Kill()
	<-r.exited
}

// limitedBuffer keeps the first max bytes written (QEMU's stderr).
type limitedBuffer struct {
	b   *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// probeQEMU asks QEMU (no accelerator needed: -machine none under TCG)
// for its version, machines, CPU models and QMP schema.
func probeQEMU(ctx context.Context, binary string) (QEMU, error) {
	q := QEMU{Binary: binary}
	r, err := startQEMU(ctx, binary, "-machine", "none", "-accel", "tcg")
	if err != nil {
		return q, fmt.Errorf("start %s: %w", binary, err)
	}
	defer r.stop()
	var v struct {
		QEMU    struct{ Major, Minor, Micro int } `json:"qemu"`
		Package string                            `json:"package"`
	}
	if err := r.mon.Execute(ctx, "query-version", nil, &v); err != nil {
		return q, fmt.Errorf("query-version: %w", err)
	}
	q.Version = fmt.Sprintf("%d.%d.%d", v.QEMU.Major, v.QEMU.Minor, v.QEMU.Micro)
	q.Package = strings.TrimSpace(v.Package)
	var schema []struct {
		Name     string   `json:"name"`
		MetaType string   `json:"meta-type"`
		Values   []string `json:"values"`
	}
	if err := r.mon.Execute(ctx, "query-qmp-schema", nil, &schema); err != nil {
		return q, fmt.Errorf("query-qmp-schema: %w", err)
	}
	for _, e := range schema {
		switch e.MetaType {
		case "command":
			q.Commands = append(q.Commands, e.Name)
		case "enum":
			q.IOURing = q.IOURing || slices.Contains(e.Values, "io_uring")
			if slices.Contains(e.Values, "cpr-reboot") { // MigMode (type names are not in the schema)
				q.MigrationModes = e.Values
			}
		}
	}
	sort.Strings(q.Commands)
	for _, c := range requiredCommands() {
		if _, found := slices.BinarySearch(q.Commands, c); !found {
			q.Missing = append(q.Missing, c)
		}
	}
	if err := probeLists(ctx, r.mon, &q); err != nil {
		return q, err
	}
	return q, nil
}

// probeLists asks for the machines, CPU models, device types and migration
// capabilities, each where QEMU has the command.
func probeLists(ctx context.Context, mon *qmp.Conn, q *QEMU) error {
	has := func(c string) bool { _, ok := slices.BinarySearch(q.Commands, c); return ok }
	if has("query-machines") {
		var ms []struct {
			Name      string `json:"name"`
			Alias     string `json:"alias"`
			IsDefault bool   `json:"is-default"`
		}
		if err := mon.Execute(ctx, "query-machines", nil, &ms); err != nil {
			return fmt.Errorf("query-machines: %w", err)
		}
		q.Aliases = map[string]string{}
		for _, m := range ms {
			q.Machines = append(q.Machines, m.Name)
			if m.Alias != "" {
				q.Machines = append(q.Machines, m.Alias)
				q.Aliases[m.Alias] = m.Name
			}
			if m.IsDefault {
				q.Default = m.Name
			}
		}
		sort.Strings(q.Machines)
	}
	if has("query-cpu-definitions") {
		var defs []struct {
			Name        string   `json:"name"`
			Unavailable []string `json:"unavailable-features"`
		}
		if err := mon.Execute(ctx, "query-cpu-definitions", nil, &defs); err != nil {
			return fmt.Errorf("query-cpu-definitions: %w", err)
		}
		for _, d := range defs {
			q.Models = append(q.Models, CPUModel{Name: d.Name, Unavailable: d.Unavailable})
		}
		sort.Slice(q.Models, func(i, j int) bool { return q.Models[i].Name < q.Models[j].Name })
	}
	if has("qom-list-types") {
		var types []struct {
			Name string `json:"name"`
		}
		args := map[string]any{"implements": "device", "abstract": false}
		if err := mon.Execute(ctx, "qom-list-types", args, &types); err != nil {
			return fmt.Errorf("qom-list-types: %w", err)
		}
		for _, t := range types {
			q.Devices = append(q.Devices, t.Name)
		}
		sort.Strings(q.Devices)
	}
	if has("query-migrate-capabilities") {
		var caps []struct {
			Capability string `json:"capability"`
		}
		if err := mon.Execute(ctx, "query-migrate-capabilities", nil, &caps); err != nil {
			return fmt.Errorf("query-migrate-capabilities: %w", err)
		}
		for _, c := range caps {
			q.MigrationCaps = append(q.MigrationCaps, c.Capability)
		}
		sort.Strings(q.MigrationCaps)
	}
	return nil
}

// tryKVM starts a q35 VM (no guest, -S) under KVM with -cpu model and the
// features in masks off, and checks that KVM is in use.
func tryKVM(ctx context.Context, binary, model string, masks []string) error {
	cpu := model
	for _, m := range masks {
		cpu += "," + m + "=off"
	}
	r, err := startQEMU(ctx, binary, "-machine", "q35", "-accel", "kvm", "-cpu", cpu, "-m", "32")
	if err != nil {
		return err
	}
	defer r.stop()
	k, err := r.mon.QueryKVM(ctx)
	if err != nil {
		return fmt.Errorf("query-kvm: %w", err)
	}
	if !k.Enabled {
		return errors.New("query-kvm: KVM not enabled")
	}
	return nil
}

// timedOut: err is a timeout of the probe's, not QEMU's answer.
func timedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)
}

// candidateMasks are the feature sets tried, in order, when a mode does not
// start under KVM as it is: MSRs that some KVMs (PVM on AMD: "failed to set
// MSR 0x10a") refuse to let the guest see.
func candidateMasks() [][]string {
	return [][]string{{"arch-capabilities"}, {"arch-capabilities", "pdcm"}, {"pmu"}}
}

// hostFeatures asks KVM's expansion of -cpu host which features it turns
// on, so only masks of features it has are tried; nil if QEMU cannot tell.
func hostFeatures(ctx context.Context, binary string) map[string]bool {
	r, err := startQEMU(ctx, binary, "-machine", "none", "-accel", "kvm")
	if err != nil {
		return nil
	}
	defer r.stop()
	var exp struct {
		Model struct {
			Props map[string]any `json:"props"`
		} `json:"model"`
	}
	args := map[string]any{"type": "full", "model": map[string]string{"name": "host"}}
	if err := r.mon.Execute(ctx, "query-cpu-model-expansion", args, &exp); err != nil {
		return nil
	}
	on := map[string]bool{}
	for k, v := range exp.Model.Props {
		if b, ok := v.(bool); ok && b {
			on[k] = true
		}
	}
	return on
}

// probeMode tries model under KVM as it is, then with the masks another
// mode needed (known), then with each candidate mask set whose features the
// host has (features is asked only if needed: it costs a QEMU start), and
// records what starts.
func probeMode(ctx context.Context, binary, model string, features func() map[string]bool, known []string) CPUMode {
	t0 := time.Now()
	m := CPUMode{Model: model}
	try := func(masks []string) bool {
		err := tryKVM(ctx, binary, model, masks)
		if err == nil {
			m.Starts, m.Masks = true, masks
			return true
		}
		if m.Error == "" {
			m.Error = err.Error()
		}
		m.TimedOut = m.TimedOut || timedOut(err) || ctx.Err() != nil
		return false
	}
	if try(nil) || known != nil && try(known) {
		m.Cost = time.Since(t0)
		return m
	}
	feats := features()
	for _, c := range candidateMasks() {
		if ctx.Err() != nil {
			break
		}
		if slices.Equal(c, known) || feats != nil && slices.ContainsFunc(c, func(f string) bool { return !feats[f] }) {
			continue
		}
		if try(c) {
			break
		}
	}
	m.Cost = time.Since(t0)
	return m
}
