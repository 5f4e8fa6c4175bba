package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	godbus "github.com/godbus/dbus/v5"
	"golang.org/x/sys/unix"
)

// Systemd is a private systemd 252 running as PID 1 of its own PID, mount and UTS
// namespace, booted into a target that starts only journald and dbus. Talk to it over
// BusAddress (Dial); its processes live in cgroups below Cgroup in every hierarchy.
type Systemd struct {
	BusAddress string // "unix:path=<RunDir>/dbus/system_bus_socket"
	PID1       int    // host PID of the sandbox's systemd
	RunDir     string // host directory bind-mounted over /run inside
	JournalDir string // volatile journal, for journalctl -D
	ConsoleLog string // what systemd and the namespace set-up wrote to /dev/console
	UnitDir    string // a host directory systemd reads unit files from, as /etc/systemd/system
	Cgroup     string // the sandbox's cgroup path, the same below each hierarchy's root
	// StopTimeout bounds a graceful Stop before PID 1 is killed (0 means 15 s).
	StopTimeout time.Duration

	cg       *cgroupTree
	outer    *os.Process   // bash, then unshare: our own child
	pidfd    int           // pidfd of PID1, so signals never hit a recycled PID
	done     chan struct{} // closed when the unshare process has been reaped
	stopOnce sync.Once
	stopErr  error
}

// sandboxTarget is the only target booted: journald and the system bus.
const sandboxTarget = `[Unit]
Description=vmsup test sandbox
Wants=systemd-journald.socket systemd-journald.service dbus.socket dbus.service
After=systemd-journald.service dbus.service
AllowIsolate=yes
`

const journaldConf = `[Journal]
Storage=volatile
RateLimitIntervalSec=0
`

// outerScript joins the sandbox cgroups, then becomes unshare; its child, PID 1 of the
// new namespaces, runs innerScript.
const outerScript = `set -eu
IFS='
'
for f in $VMSUP_PROCS; do
	echo $$ 2>/dev/null >"$f" || { echo "testenv: cannot join cgroup $f (on cgroup v1, No space left on device is an empty cpuset.cpus or cpuset.mems on its path)" >&2; exit 1; }
done
exec unshare --pid --fork --kill-child --mount --uts --mount-proc --propagation private $VMSUP_UNSHARE_NET bash -c "$1"`

// innerScript gives systemd private copies of what it would otherwise change for the
// whole host: /run, /dev/console, the hostname, and the /sys/fs/cgroup tmpfs (systemd
// creates missing hierarchy directories there and remounts the tmpfs superblock
// read-only, which a bind mount of the host's tmpfs would pass on to the host). The
// host's hierarchies are unmounted beneath it, not shadowed: systemd re-reads the mount
// table for each mount it sets up for a sandboxed unit, and a hybrid host's shadowed
// copies were a quarter of that table, which no real host has.
const innerScript = `set -eu
mount --make-rprivate /
mount --rbind /sys/fs/cgroup "$VMSUP_CGSTAGE"
umount -R -l /sys/fs/cgroup
mount -t tmpfs -o mode=0755 tmpfs /sys/fs/cgroup
for e in "$VMSUP_CGSTAGE"/*; do
	n=${e##*/}
	if [ -L "$e" ]; then
		cp -P "$e" "/sys/fs/cgroup/$n"
	elif mountpoint -q "$e"; then
		mkdir "/sys/fs/cgroup/$n"
		mount --rbind "$e" "/sys/fs/cgroup/$n"
	fi
done
umount -R "$VMSUP_CGSTAGE"
mount --bind "$VMSUP_RUN" /run
mount --bind "$VMSUP_CONSOLE" /dev/console
hostname vmsup-test
if [ -d /var/log/journal ]; then mount -t tmpfs -o mode=0755 tmpfs /var/log/journal; fi
exec env -i container=vmsup-test SYSTEMD_UNIT_PATH="$VMSUP_UNITS" \
	SYSTEMD_GENERATOR_PATH="$VMSUP_EMPTY" SYSTEMD_ENVIRONMENT_GENERATOR_PATH="$VMSUP_EMPTY" \
	PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	/usr/lib/systemd/systemd --system --unit=` + BootTarget

// BootTarget is the target the sandbox boots: a unit it wants starts at "boot".
const BootTarget = "vmsup-test.target"

// StartSystemd boots a sandboxed systemd with its state under dir (which must exist and
// be short enough for a socket path) and waits, up to 20 s or ctx, until its bus answers
// and its state is "running". unitDirs are searched for units before the stock ones, as
// /etc/systemd/system is on a host. Transient units are searched first, as systemd
// does without SYSTEMD_UNIT_PATH: else a daemon-reload loses their files ("not-found"). Call Stop when done; after an error nothing is left
// to stop.
func StartSystemd(ctx context.Context, dir string, unitDirs ...string) (*Systemd, error) {
	return startSystemd(ctx, dir, false, unitDirs)
}

// StartSystemdHost is StartSystemd in a network namespace of its own, with
// only lo: a "host" of a multi-host test, which JoinLAN then connects.
// Everything in the sandbox (its units, QEMU) has that network.
func StartSystemdHost(ctx context.Context, dir string, unitDirs ...string) (*Systemd, error) {
	return startSystemd(ctx, dir, true, unitDirs)
}

func startSystemd(ctx context.Context, dir string, netns bool, unitDirs []string) (*Systemd, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("testenv: systemd sandbox needs root")
	}
	for _, p := range []string{"/usr/lib/systemd/systemd", "/usr/bin/unshare", "/usr/bin/nsenter", "/usr/bin/dbus-daemon"} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("testenv: systemd sandbox: %w", err)
		}
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	s := &Systemd{
		RunDir:     filepath.Join(dir, "run"),
		ConsoleLog: filepath.Join(dir, "console.log"),
		pidfd:      -1,
		done:       make(chan struct{}),
	}
	s.JournalDir = filepath.Join(s.RunDir, "log", "journal")
	sock := filepath.Join(s.RunDir, "dbus", "system_bus_socket")
	if len(sock) >= 108 {
		return nil, fmt.Errorf("testenv: socket path too long (%d bytes): %s", len(sock), sock)
	}
	s.BusAddress = "unix:path=" + sock
	units, empty, cgstage := filepath.Join(dir, "units"), filepath.Join(dir, "empty"), filepath.Join(dir, "cgroup")
	s.UnitDir = units
	if err := layout(s.RunDir, units, empty, cgstage, s.ConsoleLog); err != nil {
		return nil, fmt.Errorf("testenv: systemd sandbox: %w", err)
	}
	if s.cg, err = newCgroupTree(); err != nil {
		return nil, fmt.Errorf("testenv: systemd sandbox: %w", err)
	}
	s.Cgroup = s.cg.rel
	console, err := os.OpenFile(s.ConsoleLog, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		s.cg.remove()
		return nil, err
	}
	defer console.Close()
	cmd := exec.Command("bash", "-c", outerScript, "vmsup-sandbox", innerScript)
	cmd.Env = append(os.Environ(),
		"VMSUP_PROCS="+strings.Join(s.cg.procsFiles(), "\n"),
		"VMSUP_RUN="+s.RunDir, "VMSUP_CONSOLE="+s.ConsoleLog, "VMSUP_UNITS="+strings.Join(append(append([]string{"/run/systemd/transient"}, unitDirs...), units), ":"), "VMSUP_EMPTY="+empty,
		"VMSUP_CGSTAGE="+cgstage, "VMSUP_UNSHARE_NET="+map[bool]string{true: "--net"}[netns])
	cmd.Stdout, cmd.Stderr = console, console
	// If this test process dies, the kernel kills unshare, and unshare kills PID 1.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := startPinned(cmd, s.done); err != nil {
		s.cg.remove()
		return nil, fmt.Errorf("testenv: start systemd sandbox: %w", err)
	}
	s.outer = cmd.Process
	if err := s.waitReady(ctx, cmd.Process.Pid); err != nil {
		s.Stop()
		return nil, fmt.Errorf("testenv: systemd sandbox: %w\n--- %s (tail):\n%s", err, s.ConsoleLog, tail(s.ConsoleLog, 30))
	}
	return s, nil
}

// masked units: journald's /dev/log socket would leave a symlink in the host's /dev.
var masked = map[string]bool{"systemd-journald-dev-log.socket": true}

// layout prepares the host side: the /run directory with a journald drop-in, a unit
// directory that hides every *.wants/*.requires directory, an empty generator directory.
func layout(run, units, empty, cgstage, console string) error {
	for _, d := range []string{filepath.Join(run, "systemd", "journald.conf.d"), units, empty, cgstage} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(run, "systemd", "journald.conf.d", "vmsup-test.conf"), []byte(journaldConf), 0o644); err != nil {
		return err
	}
	const sys = "/usr/lib/systemd/system"
	ents, err := os.ReadDir(sys)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if n := e.Name(); e.IsDir() && (strings.HasSuffix(n, ".wants") || strings.HasSuffix(n, ".requires")) {
			continue
		}
		target := filepath.Join(sys, e.Name())
		if masked[e.Name()] {
			target = "/dev/null"
		}
		if err := os.Symlink(target, filepath.Join(units, e.Name())); err != nil && !os.IsExist(err) {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(units, BootTarget), []byte(sandboxTarget), 0o644); err != nil {
		return err
	}
	return os.WriteFile(console, nil, 0o644)
}

// startPinned starts cmd from an OS thread that stays locked until cmd exits: Pdeathsig
// fires when the thread that forked the child exits, and Go may end threads that other
// goroutines locked (network namespace tests do). done is closed after cmd is reaped.
func startPinned(cmd *exec.Cmd, done chan struct{}) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
		close(done)
	}()
	return <-started
}

// waitReady finds PID 1 (the child of unshare) and polls the bus until systemd runs.
func (s *Systemd) waitReady(ctx context.Context, outer int) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	state := "no bus yet"
	for {
		if s.PID1 == 0 {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", outer, outer))
			if f := strings.Fields(string(b)); len(f) > 0 {
				pid, _ := strconv.Atoi(f[0])
				fd, err := unix.PidfdOpen(pid, 0)
				if err != nil {
					return fmt.Errorf("pidfd_open %d: %w", pid, err)
				}
				s.PID1, s.pidfd = pid, fd
			}
		}
		if s.PID1 != 0 {
			if st, err := s.systemState(); err == nil {
				state = st
				if st == "running" {
					return nil
				}
			} else {
				state = err.Error()
			}
		}
		select {
		case <-s.done:
			return errors.New("sandbox exited during start-up")
		case <-ctx.Done():
			return fmt.Errorf("not ready (last state: %s): %w", state, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *Systemd) systemState() (string, error) {
	c, err := s.dialBus()
	if err != nil {
		return "", err
	}
	defer c.Close()
	v, err := c.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1").
		GetProperty("org.freedesktop.systemd1.Manager.SystemState")
	if err != nil {
		return "", err
	}
	st, _ := v.Value().(string)
	return st, nil
}

// dialBus opens an authenticated connection to the sandbox's system bus.
func (s *Systemd) dialBus() (*godbus.Conn, error) {
	c, err := godbus.Dial(s.BusAddress)
	if err != nil {
		return nil, err
	}
	if err := c.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
		c.Close()
		return nil, err
	}
	if err := c.Hello(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Stop asks systemd to exit (re-asking every 2 s), kills PID 1 after StopTimeout, waits for
// the namespace to die and removes the sandbox's cgroups. It is safe to call twice.
func (s *Systemd) Stop() error {
	s.stopOnce.Do(func() { s.stopErr = s.stop() })
	return s.stopErr
}

func (s *Systemd) stop() error {
	var errs []error
	timeout := s.StopTimeout
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	deadline := time.Now().Add(timeout)
	for exited := false; !exited; {
		if time.Now().After(deadline) {
			errs = append(errs, fmt.Errorf("testenv: systemd did not exit in %v, killed", timeout))
			s.kill()
			select {
			case <-s.done:
			case <-time.After(10 * time.Second):
				errs = append(errs, errors.New("testenv: sandbox still running after SIGKILL"))
			}
			break
		}
		if s.PID1 != 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			s.nsenter(ctx, "systemctl", "--no-block", "exit") // fails once it is going away
			cancel()
		} else {
			s.kill()
		}
		select {
		case <-s.done:
			exited = true
		case <-time.After(min(2*time.Second, time.Until(deadline)+time.Millisecond)):
		}
	}
	if s.pidfd >= 0 {
		unix.Close(s.pidfd)
		s.pidfd = -1
	}
	if err := s.cg.remove(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// kill sends SIGKILL to PID 1, which takes the whole namespace with it, and to unshare,
// which kills PID 1 if it is not known yet.
func (s *Systemd) kill() {
	if s.pidfd >= 0 {
		unix.PidfdSendSignal(s.pidfd, unix.SIGKILL, nil, 0)
	}
	s.outer.Kill()
}
