package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// OVS is a private Open vSwitch: ovsdb-server and ovs-vswitchd started by
// the test with every run, log, database and config directory in Dir, so
// they never touch a host installation. This kernel has no openvswitch
// module, so bridges use the userspace datapath (datapath_type=netdev).
// Start it in a private network namespace (InPrivateNetns): the bridges'
// internal ports and the ports added to them live in the daemons'
// namespace.
type OVS struct {
	Dir string // OVS_RUNDIR, OVS_LOGDIR, OVS_DBDIR and OVS_SYSCONFDIR
	DB  string // "unix:<Dir>/db.sock", for ovs-vsctl --db

	db, vswitchd *exec.Cmd
	exited       map[*exec.Cmd]chan struct{}
}

// OVSSchema is Debian's OVS database schema.
const OVSSchema = "/usr/share/openvswitch/vswitch.ovsschema"

// StartOVS starts the two daemons under dir and waits until ovs-vswitchd
// applies a change. A missing OVS installation is an error naming the
// package.
func StartOVS(ctx context.Context, dir string) (*OVS, error) {
	for _, b := range []string{"ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl"} {
		if _, err := exec.LookPath(b); err != nil {
			return nil, fmt.Errorf("testenv: %s not found: install openvswitch-switch (scripts/install-deps.sh)", b)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	o := &OVS{Dir: dir, DB: "unix:" + filepath.Join(dir, "db.sock"), exited: map[*exec.Cmd]chan struct{}{}}
	conf := filepath.Join(dir, "conf.db")
	if out, err := o.cmd(ctx, "ovsdb-tool", "create", conf, OVSSchema).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("testenv: ovsdb-tool create: %w: %s", err, out)
	}
	var err error
	o.db, err = o.start("ovsdb-server", conf, "--remote=punix:"+filepath.Join(dir, "db.sock"),
		"--pidfile="+filepath.Join(dir, "ovsdb-server.pid"), "--unixctl="+filepath.Join(dir, "ovsdb-server.ctl"),
		"--log-file="+filepath.Join(dir, "ovsdb-server.log"))
	if err != nil {
		return nil, err
	}
	if err := o.wait(ctx, func() bool { return o.Vsctl(ctx, "--no-wait", "init") == nil }); err != nil {
		o.Stop()
		return nil, fmt.Errorf("testenv: ovsdb-server did not answer: %w; log:\n%s", err, tail(filepath.Join(dir, "ovsdb-server.log"), 20))
	}
	o.vswitchd, err = o.start("ovs-vswitchd", o.DB, "--pidfile="+filepath.Join(dir, "ovs-vswitchd.pid"),
		"--unixctl="+filepath.Join(dir, "ovs-vswitchd.ctl"), "--log-file="+filepath.Join(dir, "ovs-vswitchd.log"))
	if err != nil {
		o.Stop()
		return nil, err
	}
	// A change that waits for ovs-vswitchd (no --no-wait) succeeds once it runs.
	if err := o.wait(ctx, func() bool {
		return o.Vsctl(ctx, "--timeout=2", "set", "Open_vSwitch", ".", "external_ids:vmsup-test=1") == nil
	}); err != nil {
		o.Stop()
		return nil, fmt.Errorf("testenv: ovs-vswitchd did not apply a change: %w; log:\n%s", err, tail(filepath.Join(dir, "ovs-vswitchd.log"), 20))
	}
	return o, nil
}

func (o *OVS) cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, name, args...)
	c.Env = append(os.Environ(), "OVS_RUNDIR="+o.Dir, "OVS_LOGDIR="+o.Dir, "OVS_DBDIR="+o.Dir, "OVS_SYSCONFDIR="+o.Dir,
		"OVS_PKGDATADIR=/usr/share/openvswitch", "OVS_BINDIR=/usr/bin")
	return c
}

// start runs a daemon in the foreground (as our child, so Stop kills it by
// its pid) with its output in Dir.
func (o *OVS) start(name string, args ...string) (*exec.Cmd, error) {
	c := o.cmd(context.Background(), name, args...)
	out, err := os.Create(filepath.Join(o.Dir, name+".out"))
	if err != nil {
		return nil, err
	}
	c.Stdout, c.Stderr = out, out
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("testenv: start %s: %w", name, err)
	}
	done := make(chan struct{})
	o.exited[c] = done
	go func() { c.Wait(); out.Close(); close(done) }()
	return c, nil
}

func (o *OVS) wait(ctx context.Context, ok func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for !ok() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// Vsctl runs ovs-vsctl against this OVS; the error carries its stderr.
func (o *OVS) Vsctl(ctx context.Context, args ...string) error {
	_, err := o.VsctlOutput(ctx, args...)
	return err
}

// VsctlOutput runs ovs-vsctl and returns its standard output.
func (o *OVS) VsctlOutput(ctx context.Context, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	c := o.cmd(ctx, "ovs-vsctl", append([]string{"--db=" + o.DB}, args...)...)
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		return stdout.String(), fmt.Errorf("ovs-vsctl %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.String(), nil
}

// AddBridge adds a bridge on the userspace datapath.
func (o *OVS) AddBridge(ctx context.Context, name string) error {
	return o.Vsctl(ctx, "add-br", name, "--", "set", "Bridge", name, "datapath_type=netdev")
}

// Stop ends both daemons (SIGTERM, then SIGKILL after 5 s), by the pids of
// the processes Start made.
func (o *OVS) Stop() error {
	var errs []error
	for _, c := range []*exec.Cmd{o.vswitchd, o.db} {
		if c == nil || c.Process == nil {
			continue
		}
		done := o.exited[c]
		select {
		case <-done:
			continue
		default:
		}
		_ = c.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = c.Process.Kill()
			<-done
			errs = append(errs, fmt.Errorf("testenv: %s ignored SIGTERM", filepath.Base(c.Path)))
		}
	}
	return errors.Join(errs...)
}
