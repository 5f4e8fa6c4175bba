package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor"
)

// diskHost is one "host" of the migrate-disk section, made as
// supervisortest.TwoHosts makes them (that package needs a *testing.T): a
// network namespace inside a systemd sandbox's mount namespace, its own
// state root and Supervisor. The disk directory is each host's own (as
// supervisortest.LocalDisks makes it): B binds another directory over it
// in its sandbox's mount namespace, so whatever touches B's disks runs
// there (its receiver, its CLI, its QEMU).
type diskHost struct {
	name  string
	sd    *testenv.Systemd
	ns    string // the namespace's name inside the sandbox
	netns string // its path from here
	addr  string
	root  string
	sup   *supervisor.Supervisor
	env   *testenv.Env
	self  string // the vmsup CLI
}

// enter is the prefix that runs a command in the host's sandbox's mount
// and PID namespaces.
func (h *diskHost) enter() []string {
	return []string{"nsenter", "-t", fmt.Sprint(h.sd.PID1), "-m", "-p", "--"}
}

// view is path as the host sees it, from here.
func (h *diskHost) view(path string) string {
	return fmt.Sprintf("/proc/%d/root%s", h.sd.PID1, path)
}

// environ is the environment of a vmsup run as the host.
func (h *diskHost) environ() []string {
	return []string{"VMSUP_ROOT=" + h.root, "VMSUP_SYSTEMD_BUS=" + h.sd.BusAddress, "VMSUP_JOURNAL_DIR=" + h.sd.JournalDir,
		"VMSUP_UNIT_DIR=" + filepath.Join(h.root, "etc-systemd"), "VMSUP_BOOT_TARGET=" + testenv.BootTarget,
		"VMSUP_RUN_DIR=" + filepath.Join(h.root, "run"), "VMSUP_QEMU=" + h.env.QEMU, "VMSUP_HOST_CACHE=" + h.env.CapsCache,
		"VMSUP_ALLOW_PATHS=" + strings.Join(h.env.AllowPaths, ":"), "VMSUP_BLOCK_DIRS=" + strings.Join(h.env.BlockDirs, ":")}
}

// transport runs "vmsup migrate-receive" as the host: in its network
// namespace and its sandbox's mount and PID namespaces.
func (h *diskHost) transport() []string {
	argv := append([]string{"env"}, h.environ()...)
	argv = append(append(append(argv, "nsenter", "--net="+h.netns), h.enter()...), h.self, "migrate-receive")
	return argv
}

// cli is "vmsup ARGS" run as the host, as an operator there runs it.
func (h *diskHost) cli(ctx context.Context, args ...string) *exec.Cmd {
	argv := append([]string{"--net=" + h.netns}, h.enter()[1:]...)
	cmd := exec.CommandContext(ctx, "nsenter", append(append(argv, h.self), args...)...)
	cmd.Env = append(os.Environ(), h.environ()...)
	return cmd
}

// dial opens a connection from inside the host's network namespace: on a
// locked thread moved into it, discarded afterwards (its goroutine exits
// locked).
func (h *diskHost) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open(h.netns)
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{nil, fmt.Errorf("setns %s: %w", h.netns, err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// diskHosts are A (the bench's sandbox) and B (a second sandbox), joined
// by a veth pair made inside their namespaces (nothing on this machine's
// own), on a /24 picked from this process's pid; disks is local to each.
type diskHosts struct {
	a, b  *diskHost
	disks string
	undo  []func()
}

func (d *diskHosts) close() {
	for i := len(d.undo) - 1; i >= 0; i-- {
		d.undo[i]()
	}
}

func runArgv(ctx context.Context, argv ...string) error {
	if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// twoDiskHosts makes A and B under dir (see diskHosts); close undoes it.
func (f *fixture) twoDiskHosts(ctx context.Context, dir string) (_ *diskHosts, err error) {
	d := &diskHosts{disks: filepath.Join(dir, "disks")}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	sdB, err := testenv.StartSystemd(ctx, filepath.Join(dir, "sdB"))
	if err != nil {
		return nil, fmt.Errorf("second systemd sandbox (host B): %w", err)
	}
	d.undo = append(d.undo, func() { sdB.Stop() })
	tag := fmt.Sprint(os.Getpid() % 10000)
	subnet := fmt.Sprintf("10.99.%d.", os.Getpid()%250+1)
	d.a = &diskHost{name: "A", sd: f.env.Systemd, ns: "vbdiskA" + tag, addr: subnet + "1", env: f.env, self: f.vmsupBin}
	d.b = &diskHost{name: "B", sd: sdB, ns: "vbdiskB" + tag, addr: subnet + "2", env: f.env, self: f.vmsupBin}
	for _, h := range []*diskHost{d.a, d.b} {
		if err := runArgv(ctx, append(h.enter(), "ip", "netns", "add", h.ns)...); err != nil {
			return nil, err
		}
		d.undo = append(d.undo, func() { runArgv(context.Background(), append(h.enter(), "ip", "netns", "delete", h.ns)...) })
		h.netns = h.view("/run/netns/" + h.ns)
		h.root = filepath.Join(dir, "root"+h.name)
		if h.sup, err = supervisor.New(supervisor.Options{Root: h.root, SystemdBus: h.sd.BusAddress, JournalDir: h.sd.JournalDir,
			HostCaps: f.env.Caps, Self: f.vmsupBin, QEMU: f.env.QEMU, UnitDir: filepath.Join(h.root, "etc-systemd"),
			BootTarget: testenv.BootTarget, RunDir: filepath.Join(h.root, "run"), AllowPaths: f.env.AllowPaths, BlockDirs: f.env.BlockDirs}); err != nil {
			return nil, err
		}
		d.undo = append(d.undo, func() { h.sup.Close() })
	}
	devA, devB := "vbdA"+tag, "vbdB"+tag
	if err := runArgv(ctx, "nsenter", "--net="+d.a.netns, "ip", "link", "add", devA, "type", "veth", "peer", "name", devB, "netns", d.b.netns); err != nil {
		return nil, err
	}
	for _, x := range []struct {
		h   *diskHost
		dev string
	}{{d.a, devA}, {d.b, devB}} {
		in := []string{"nsenter", "--net=" + x.h.netns, "ip"}
		for _, args := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", x.h.addr + "/24", "dev", x.dev}, {"link", "set", x.dev, "up"}} {
			if err := runArgv(ctx, append(in, args...)...); err != nil {
				return nil, err
			}
		}
	}
	// B's directory is bound over it, both on this machine's disk: a tmpfs
	// would charge the copy's pages to B's QEMU unit, past its memory limit.
	bdisks := filepath.Join(dir, "disks-B")
	for _, p := range []string{d.disks, bdisks} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, err
		}
	}
	if err := runArgv(ctx, append(d.b.enter(), "mount", "--bind", bdisks, d.disks)...); err != nil {
		return nil, err
	}
	d.undo = append(d.undo, func() { runArgv(context.Background(), append(d.b.enter(), "umount", "-l", d.disks)...) })
	return d, nil
}
