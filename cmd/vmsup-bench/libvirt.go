package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
)

// libvirt is the baseline: Debian 12's monolithic libvirtd 9.0 and virtlogd,
// started by hand the way /work/shared/notes/libvirt-baseline.md found to
// work without systemd: in a new network and mount namespace (its QEMUs then
// keep their cgroups), under `tini -s` so daemonized QEMUs are reaped at once,
// with a 0666 copy of /dev/kvm bound over /dev/kvm for the libvirt-qemu user,
// and tmpfs over /run, /var/lib, /var/cache and /var/log's libvirt
// directories so the run leaves nothing behind. Its sockets live in dir.
type libvirt struct {
	cpuMasks       []string // features -cpu host needs off here (host probe)
	dir, sock, uri string
	tini           *exec.Cmd
	done           chan struct{}
	libvirtdPID    int
	virtlogdPID    int
	conn           *golibvirt.Libvirt // the one persistent API connection
	qemuUID        int
	newCgroups     []string // "machine" directories libvirt made; removed at stop
	newDirs        []string // host directories made as mount points; removed at stop
}

func (l *libvirt) removeDirs() {
	for _, d := range l.newDirs {
		os.Remove(d)
	}
}

const libvirtdConf = `unix_sock_dir = %q
unix_sock_rw_perms = "0700"
unix_sock_ro_perms = "0700"
unix_sock_admin_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:file:%s/libvirtd.log"
`

// libvirtScript runs in the new namespaces as tini's child.
const libvirtScript = `set -eu
mount --make-rprivate /
for d in /run/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt; do
	mount -t tmpfs -o mode=0755 tmpfs "$d"
done
mkdir -p /var/log/libvirt/qemu /var/lib/libvirt/qemu
mount -t tmpfs -o mode=0755 tmpfs "$LV_DIR/dev"
if [ -e /dev/kvm ]; then # hosts without KVM: the domains run under TCG
	mknod -m 0666 "$LV_DIR/dev/kvm" c 10 232
	mount --bind "$LV_DIR/dev/kvm" /dev/kvm
fi
ip link set lo up
virtlogd --pid-file "$LV_DIR/virtlogd.pid" &
for i in $(seq 200); do [ -S /run/libvirt/virtlogd-sock ] && break; sleep 0.05; done
libvirtd -f "$LV_DIR/libvirtd.conf" --pid-file "$LV_DIR/libvirtd.pid" &
wait
`

// libvirtDirs must exist on the host for the tmpfs mounts in the namespace;
// the ones this run creates are removed again.
var libvirtDirs = []string{"/run/libvirt", "/var/lib/libvirt", "/var/cache/libvirt", "/var/log/libvirt"}

func startLibvirt(ctx context.Context, dir string) (*libvirt, error) {
	for _, b := range []string{"libvirtd", "virtlogd", "virsh", "tini", "unshare"} {
		if _, err := exec.LookPath(b); err != nil {
			return nil, fmt.Errorf("libvirt baseline: %s not found (run scripts/install-bench-deps.sh): %w", b, err)
		}
	}
	u, err := user.Lookup("libvirt-qemu")
	if err != nil {
		return nil, fmt.Errorf("libvirt baseline: %w", err)
	}
	l := &libvirt{dir: dir, done: make(chan struct{})}
	l.qemuUID, _ = strconv.Atoi(u.Uid)
	l.sock = filepath.Join(dir, "sock", "libvirt-sock")
	l.uri = "qemu:///system?socket=" + l.sock
	for _, d := range []string{filepath.Join(dir, "sock"), filepath.Join(dir, "dev"), filepath.Join(dir, "vm")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	// QEMU runs as libvirt-qemu and creates its console socket and log here.
	if err := os.Chown(filepath.Join(dir, "vm"), l.qemuUID, -1); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(libvirtdConf, filepath.Join(dir, "sock"), dir)
	if err := os.WriteFile(filepath.Join(dir, "libvirtd.conf"), []byte(conf), 0o644); err != nil {
		return nil, err
	}
	for _, d := range libvirtDirs {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			if err := os.Mkdir(d, 0o755); err != nil {
				return nil, err
			}
			l.newDirs = append(l.newDirs, d)
		}
	}
	l.noteCgroups()
	log, err := os.Create(filepath.Join(dir, "namespace.log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command("unshare", "--net", "--mount", "--propagation", "private", "--",
		"tini", "-s", "--", "bash", "-c", libvirtScript)
	cmd.Env = append(os.Environ(), "LV_DIR="+dir)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		l.removeDirs()
		return nil, fmt.Errorf("libvirt baseline: %w", err)
	}
	l.tini = cmd
	go func() { cmd.Wait(); close(l.done) }()
	if err := l.waitReady(ctx); err != nil {
		l.stop()
		return nil, fmt.Errorf("libvirt baseline: %w\n%s", err, tailFile(filepath.Join(dir, "namespace.log"), 20)+tailFile(filepath.Join(dir, "libvirtd.log"), 20))
	}
	return l, nil
}

// waitReady waits for both pid files and a working API connection.
func (l *libvirt) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	last := errors.New("no pid files yet")
	for {
		if l.libvirtdPID == 0 {
			l.libvirtdPID = readPID(filepath.Join(l.dir, "libvirtd.pid"))
		}
		if l.virtlogdPID == 0 {
			l.virtlogdPID = readPID(filepath.Join(l.dir, "virtlogd.pid"))
		}
		if l.libvirtdPID != 0 {
			c := golibvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(l.sock), dialers.WithLocalTimeout(2*time.Second)))
			if last = c.ConnectToURI(golibvirt.QEMUSystem); last == nil {
				if _, last = c.ConnectGetVersion(); last == nil {
					l.conn = c
					return nil
				}
				c.Disconnect()
			}
		}
		select {
		case <-l.done:
			return errors.New("libvirtd's namespace exited during start-up")
		case <-ctx.Done():
			return fmt.Errorf("libvirtd not ready: %v", last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// noteCgroups records the "machine" partitions libvirt may create (at the
// root of each cgroup v1 hierarchy, or below the cgroup libvirtd inherits
// from this process) that do not exist yet, to remove them at stop.
func (l *libvirt) noteCgroups() {
	own := map[string]string{} // hierarchy directory name -> this process's path in it
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) == 3 && parts[1] != "" {
				own[strings.TrimPrefix(parts[1], "name=")] = parts[2]
			}
		}
	}
	hs, _ := os.ReadDir("/sys/fs/cgroup")
	for _, h := range hs {
		base := filepath.Join("/sys/fs/cgroup", h.Name())
		cands := []string{filepath.Join(base, "machine")}
		if p, ok := own[h.Name()]; ok && p != "/" {
			cands = append(cands, filepath.Join(base, p, "machine"))
		}
		for _, c := range cands {
			if _, err := os.Stat(c); errors.Is(err, os.ErrNotExist) {
				l.newCgroups = append(l.newCgroups, c)
			}
		}
	}
}

// stop destroys any domain left, stops libvirtd and virtlogd by pid, waits
// for the namespace to end and removes what libvirt left in cgroupfs.
func (l *libvirt) stop() error {
	var errs []error
	if l.conn != nil {
		if doms, _, err := l.conn.ConnectListAllDomains(1, 0); err == nil {
			for _, d := range doms {
				_ = l.conn.DomainDestroy(d)
			}
		}
		l.conn.Disconnect()
		l.conn = nil
	}
	for _, pid := range []int{l.libvirtdPID, l.virtlogdPID} {
		if pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
	}
	select {
	case <-l.done:
	case <-time.After(15 * time.Second):
		errs = append(errs, errors.New("libvirt baseline: daemons did not exit in 15 s, killed"))
		for _, pid := range []int{l.libvirtdPID, l.virtlogdPID} {
			if pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if l.tini != nil {
			l.tini.Process.Kill()
		}
		<-l.done
	}
	for _, d := range l.newCgroups {
		removeCgroupTree(d) // empty once every domain is gone
	}
	l.removeDirs()
	return errors.Join(errs...)
}

// virsh runs one virsh command against this libvirtd.
func (l *libvirt) virsh(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "virsh", append([]string{"-q", "-c", l.uri}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("virsh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// create starts a transient domain over the persistent API connection.
func (l *libvirt) create(xml string) (golibvirt.Domain, error) {
	return l.conn.DomainCreateXML(xml, golibvirt.DomainNone)
}

// waitGone polls until the transient domain name is no longer defined.
func (l *libvirt) waitGone(ctx context.Context, name string) error {
	for {
		if _, err := l.conn.DomainLookupByName(name); err != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("domain %s still there: %w", name, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func (l *libvirt) destroy(name string) error {
	d, err := l.conn.DomainLookupByName(name)
	if err != nil {
		return err
	}
	return l.conn.DomainDestroy(d)
}

// domainXML describes the libvirt equivalent of benchSpec: q35, one vCPU,
// the same memory, serial console on a unix socket with a log file, the same
// read-only raw disk or direct kernel boot, no USB, no balloon.
func (l *libvirt) domainXML(name string, k vmKind, memMiB int, disk string, g guestFiles) string {
	typ, cpu := "kvm", `<cpu mode='host-passthrough'>`
	for _, m := range l.cpuMasks { // what the host probe found this KVM refuses
		cpu += `<feature policy='disable' name='` + m + `'/>`
	}
	cpu += `</cpu>`
	osx := `<os><type arch='x86_64' machine='q35'>hvm</type></os>`
	dev := fmt.Sprintf(`<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='%s'/><target dev='vda' bus='virtio'/><readonly/></disk>`, disk)
	if k != kindIdle {
		typ, cpu = "qemu", `<cpu mode='maximum'/>`
	}
	if k == kindGuest {
		osx = fmt.Sprintf(`<os><type arch='x86_64' machine='q35'>hvm</type><kernel>%s</kernel><initrd>%s</initrd><cmdline>console=ttyS0</cmdline></os>`, g.kernel, g.initrd)
		dev = ""
	}
	return fmt.Sprintf(`<domain type='%s'>
  <name>%s</name>
  <memory unit='MiB'>%d</memory>
  <vcpu>1</vcpu>
  %s
  <features><acpi/></features>
  %s
  <on_poweroff>destroy</on_poweroff>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    %s
    <serial type='unix'><source mode='bind' path='%s'/><log file='%s' append='off'/></serial>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
</domain>
`, typ, name, memMiB, osx, cpu, dev, l.consoleSock(name), l.consoleLog(name))
}

func (l *libvirt) consoleSock(name string) string { return filepath.Join(l.dir, "vm", name+".sock") }
func (l *libvirt) consoleLog(name string) string  { return filepath.Join(l.dir, "vm", name+".log") }

// daemonRSS returns libvirtd's and virtlogd's resident memory in bytes.
func (l *libvirt) daemonRSS() (libvirtd, virtlogd int64) {
	return rssOf(l.libvirtdPID), rssOf(l.virtlogdPID)
}

// removeCgroupTree removes an empty cgroup directory and its empty
// children, deepest first (cgroupfs directories are removed with rmdir).
func removeCgroupTree(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.IsDir() {
			removeCgroupTree(filepath.Join(dir, e.Name()))
		}
	}
	_ = os.Remove(dir)
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "--- " + path + ":\n" + strings.Join(lines, "\n") + "\n"
}
