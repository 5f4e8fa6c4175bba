package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Ceph is a real single-node Ceph cluster on loopback for tests: one
// monitor and one memstore OSD (no manager: RBD does not need one), with
// cephx authentication, every daemon started by hand in a private directory
// and stopped by pid. RBD images live in pool "rbd".
//
// Without a manager `ceph pg stat` and `ceph df` block forever, so every CLI
// call goes through CLI/RBD, which put a timeout on it.
type Ceph struct {
	Dir        string
	Conf       string // full ceph.conf with the admin keyring (daemons and CLI)
	ClientConf string // ceph.conf with only monitors and auth, no keyring (what a VM gets)
	MonAddr    string // "127.0.0.1:PORT"
	AdminKey   string // client.admin's cephx key (base64), for a VM's key secret
	Pool       string // "rbd"

	procs []*exec.Cmd
}

// cephCallTimeout bounds each ceph/rbd CLI call.
const cephCallTimeout = 60 * time.Second

// StartCeph creates and starts the cluster under dir and makes pool "rbd".
// A failure says which step failed with the daemon's log tail.
func StartCeph(ctx context.Context, dir string) (*Ceph, error) {
	return StartCephOn(ctx, dir, "127.0.0.1")
}

// StartCephOn is StartCeph with the daemons on ip (a test LAN's bridge,
// which hosts in network namespaces reach).
func StartCephOn(ctx context.Context, dir, ip string) (_ *Ceph, err error) {
	for _, b := range []string{"ceph-mon", "ceph-osd", "ceph", "rbd", "ceph-authtool", "monmaptool"} {
		if _, err := exec.LookPath(b); err != nil {
			return nil, fmt.Errorf("testenv: %s not found (apt-get install ceph-mon ceph-osd ceph-common): %w", b, err)
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	c := &Ceph{Dir: dir, Conf: filepath.Join(dir, "ceph.conf"), ClientConf: filepath.Join(dir, "client.conf"),
		MonAddr: net.JoinHostPort(ip, strconv.Itoa(port)), Pool: "rbd"}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	for _, d := range []string{"run", "log", "mon/ceph-a", "osd/ceph-0"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	fsid, keyring := uuid(), filepath.Join(dir, "keyring")
	if err := c.writeConfig(fsid, keyring); err != nil {
		return nil, err
	}
	for _, step := range []func(context.Context) error{
		func(ctx context.Context) error { return c.startMon(ctx, fsid, keyring) },
		c.startOSD,
		c.makePool,
	} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// writeConfig writes the daemons' ceph.conf and the clients' client.conf.
func (c *Ceph) writeConfig(fsid, keyring string) error {
	common := fmt.Sprintf(`[global]
fsid = %s
mon host = v1:%s
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
ms bind msgr2 = false
`, fsid, c.MonAddr)
	host, _, _ := net.SplitHostPort(c.MonAddr)
	conf := common + fmt.Sprintf(`mon initial members = a
public addr = %[3]s
keyring = %[1]s
run dir = %[2]s/run
admin socket = %[2]s/run/$name.asok
log file = %[2]s/log/$name.log
pid file = %[2]s/run/$name.pid
osd pool default size = 1
osd pool default min size = 1
osd crush chooseleaf type = 0
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
osd objectstore = memstore
memstore device bytes = 1073741824
osd data = %[2]s/osd/$cluster-$id
mon data = %[2]s/mon/$cluster-$id
`, keyring, c.Dir, host)
	if err := os.WriteFile(c.Conf, []byte(conf), 0o600); err != nil {
		return err
	}
	return os.WriteFile(c.ClientConf, []byte(common), 0o644)
}

// run runs one setup tool, bounded.
func (c *Ceph) run(ctx context.Context, name string, args ...string) error {
	cctx, cancel := context.WithTimeout(ctx, cephCallTimeout)
	defer cancel()
	out, err := exec.CommandContext(cctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("testenv: ceph: %s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// startMon makes the keys and the monitor's store, starts the monitor and
// reads client.admin's key.
func (c *Ceph) startMon(ctx context.Context, fsid, keyring string) error {
	if err := c.run(ctx, "ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", "mon.", "--cap", "mon", "allow *"); err != nil {
		return err
	}
	if err := c.run(ctx, "ceph-authtool", keyring, "--gen-key", "-n", "client.admin", "--cap", "mon", "allow *",
		"--cap", "osd", "allow *", "--cap", "mgr", "allow *"); err != nil {
		return err
	}
	monmap := filepath.Join(c.Dir, "monmap")
	if err := c.run(ctx, "monmaptool", "--create", "--add", "a", "v1:"+c.MonAddr, "--fsid", fsid, monmap); err != nil {
		return err
	}
	if err := c.run(ctx, "ceph-mon", "-c", c.Conf, "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", keyring); err != nil {
		return err
	}
	if err := c.daemon("ceph-mon", "-c", c.Conf, "-i", "a", "-f"); err != nil {
		return err
	}
	key, err := c.CLI(ctx, "auth", "get-key", "client.admin")
	if err != nil {
		return err
	}
	c.AdminKey = strings.TrimSpace(string(key))
	return nil
}

// startOSD registers, formats and starts the one (memstore) OSD.
func (c *Ceph) startOSD(ctx context.Context) error {
	osdUUID := uuid()
	if _, err := c.CLI(ctx, "osd", "new", osdUUID); err != nil {
		return err
	}
	osdKeyring := filepath.Join(c.Dir, "osd/ceph-0/keyring")
	if _, err := c.CLI(ctx, "auth", "get-or-create", "osd.0", "osd", "allow *", "mon", "allow profile osd",
		"mgr", "allow profile osd", "-o", osdKeyring); err != nil {
		return err
	}
	if err := c.run(ctx, "ceph-osd", "-c", c.Conf, "-i", "0", "--mkfs", "--osd-uuid", osdUUID, "--keyring", osdKeyring); err != nil {
		return err
	}
	return c.daemon("ceph-osd", "-c", c.Conf, "-i", "0", "-f", "--keyring", osdKeyring)
}

// makePool creates the rbd pool.
func (c *Ceph) makePool(ctx context.Context) error {
	if _, err := c.CLI(ctx, "osd", "pool", "create", c.Pool, "8"); err != nil {
		return err
	}
	_, err := c.CLI(ctx, "osd", "pool", "application", "enable", c.Pool, "rbd")
	return err
}

// daemon starts a Ceph daemon in the foreground (-f) as a child of the test.
func (c *Ceph) daemon(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = c.Dir
	logf, err := os.Create(filepath.Join(c.Dir, "log", name+".out"))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("testenv: start %s: %w", name, err)
	}
	logf.Close()
	c.procs = append(c.procs, cmd)
	return nil
}

// CLI runs `ceph -c CONF ARGS...` with a timeout and returns its stdout.
func (c *Ceph) CLI(ctx context.Context, args ...string) ([]byte, error) {
	return c.tool(ctx, "ceph", args...)
}

// RBD runs `rbd -c CONF ARGS...` with a timeout and returns its stdout.
func (c *Ceph) RBD(ctx context.Context, args ...string) ([]byte, error) {
	return c.tool(ctx, "rbd", args...)
}

func (c *Ceph) tool(ctx context.Context, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, cephCallTimeout)
	defer cancel()
	full := append([]string{"-c", c.Conf, "--connect-timeout", "30"}, args...)
	if name == "rbd" {
		full = append([]string{"-c", c.Conf}, args...)
	}
	cmd := exec.CommandContext(ctx, name, full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (timeout %s)", ctx.Err(), cephCallTimeout)
		}
		return stdout.Bytes(), fmt.Errorf("testenv: %s %s: %w: %s%s", name, strings.Join(args, " "), err,
			bytes.TrimSpace(stderr.Bytes()), c.logTail())
	}
	return stdout.Bytes(), nil
}

// logTail is the end of the daemons' output, for errors.
func (c *Ceph) logTail() string {
	var b strings.Builder
	for _, n := range []string{"ceph-mon.out", "ceph-osd.out"} {
		data, err := os.ReadFile(filepath.Join(c.Dir, "log", n))
		if err != nil || len(data) == 0 {
			continue
		}
		if len(data) > 600 {
			data = data[len(data)-600:]
		}
		fmt.Fprintf(&b, "\n%s: %s", n, data)
	}
	return b.String()
}

// Stop ends the daemons (SIGTERM, then SIGKILL by pid after 10 s), OSD
// first. The directory is left for the caller to remove.
func (c *Ceph) Stop() error {
	if c == nil {
		return nil
	}
	var errs []error
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		done := make(chan error, 1)
		_ = p.Process.Signal(syscall.SIGTERM)
		go func() { done <- p.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.Process.Kill()
			<-done
			errs = append(errs, fmt.Errorf("testenv: %s did not stop on SIGTERM; killed", p.Path))
		}
	}
	c.procs = nil
	return errors.Join(errs...)
}

func uuid() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
