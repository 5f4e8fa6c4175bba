package realguesttest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// What the seed asks cloud-init for, and what the guest prints.
const (
	vmName      = "rg"
	seedHost    = "rg-real" // the seed's hostname
	seedUser    = "tester"  // the seed's user, with the test's ssh key
	markerPath  = "/etc/vmsup-marker"
	markerText  = "written by cloud-init from vmsup's seed"
	bootedMark  = "VMSUP-REALGUEST-BOOTED " // the image prints it with the boot id at every boot
	dataSerial  = "vmsup-data"
	dataSize    = "64M"
	grownSize   = "96M"
	bootTimeout = 4 * time.Minute // a first boot with cloud-init, TCG, on a quiet host
)

// realGuest is the one booted guest the subtests share.
type realGuest struct {
	sup     *supervisor.Supervisor
	name    string // the VM
	dir     string // its files: VM file, overlay, data disk, key, backups
	file    string // the VM file
	console string // its console log
	bootID  string // the boot the guest is in
	key     string // the ssh private key whose public half the seed gives seedUser
	ip      string // its DHCP address on the lab network
	// restored is the backup's root disk restored (backup-restore).
	restored string
	rootSize string // the root disk's size in the VM file ("": none, the image's)
}

// vmTOML is the VM file: the image's kernel and initrd, a root overlay on
// the cached image, a data disk of size data, the seed and a NIC on the
// lab network.
func vmTOML(dir, pubKey, data, root string) string {
	rootSize := ""
	if root != "" {
		rootSize = fmt.Sprintf("size = %q\n", root)
	}
	userData := fmt.Sprintf(`#cloud-config
hostname: %s
manage_etc_hosts: true
users:
  - name: %s
    shell: /bin/bash
    sudo: "ALL=(ALL) NOPASSWD:ALL"
    ssh_authorized_keys: [%q]
write_files:
  - path: %s
    content: "%s\n"
`, seedHost, seedUser, strings.TrimSpace(pubKey), markerPath, markerText)
	return fmt.Sprintf(`name = %q
memory = "1G"
max_memory = "1280M"
cpus = 1
max_cpus = 2
accel = "tcg"
stop_timeout = "4m"
hotplug_slots = 3

[boot]
kernel = %q
initrd = %q
cmdline = "root=/dev/vda ro console=ttyS0 no_timer_check"

[[disk]]
name = "root"
file = %q
backing = %q
%s
[[disk]]
name = "data"
file = %q
size = %q
serial = %q

[[disk]]
name = "seed"
type = "seed"
user_data = %q

[[nic]]
name = "lan"
type = "network"
network = %q
`, vmName, filepath.Join(imageDir, "vmlinux"), filepath.Join(imageDir, "initrd.img"),
		filepath.Join(dir, "root.qcow2"), filepath.Join(imageDir, "disk.qcow2"), rootSize,
		filepath.Join(dir, "data.qcow2"), data, dataSerial, userData, labNet)
}

// writeFile writes the VM file with a data disk of size data (and the root
// disk at rootSize) and parses it.
func (g *realGuest) writeFile(t *testing.T, data string) *spec.File {
	t.Helper()
	pub, err := os.ReadFile(g.key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return supervisortest.LoadTOML(t, g.dir, vmName, vmTOML(g.dir, string(pub), data, g.rootSize))
}

// sshKey makes an ed25519 key pair in dir.
func sshKey(t *testing.T, dir string) string {
	t.Helper()
	key := filepath.Join(dir, "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vmsup-realguest", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	return key
}

// createNetwork defines the lab network (no NAT: the guest needs only the
// host) through the CLI.
func createNetwork(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, dir string) {
	t.Helper()
	def := filepath.Join(dir, "lab.toml")
	if err := os.WriteFile(def, []byte(fmt.Sprintf("name = %q\nipv4 = %q\nnat = false\n", labNet, labGW+"/24")), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := cli(ctx, sup, "network", "create", def); err != nil {
		t.Fatalf("network create: %v\n%s", err, out)
	}
	t.Cleanup(func() { cli(context.Background(), sup, "network", "rm", labNet) })
}

var bootedRE = regexp.MustCompile(regexp.QuoteMeta(bootedMark) + `([0-9a-f-]{36})`)

// waitBoot waits for a boot other than the one the guest was in to print
// its marker, and the agent to answer in it.
func (g *realGuest) waitBoot(t *testing.T, ctx context.Context, base time.Duration) {
	t.Helper()
	w := testenv.StartGuestWait("the real guest boots (its marker)", base)
	for ; ; time.Sleep(500 * time.Millisecond) {
		b, _ := os.ReadFile(g.console)
		if m := bootedRE.FindAllStringSubmatch(string(b), -1); len(m) > 0 && m[len(m)-1][1] != g.bootID {
			g.bootID = m[len(m)-1][1]
			t.Logf("boot %s after %s", g.bootID, w.Done().Round(100*time.Millisecond))
			break
		}
		if w.Expired() || ctx.Err() != nil {
			if len(b) > 3000 {
				b = b[len(b)-3000:]
			}
			t.Fatalf("no new %q: %s; the console ends:\n%s", bootedMark, w.Explain(), b)
		}
	}
	g.waitAgent(t, ctx)
}

// waitAgent waits until the guest agent answers.
func (g *realGuest) waitAgent(t *testing.T, ctx context.Context) {
	t.Helper()
	w := testenv.StartGuestWait("the real guest's agent answers", time.Minute)
	for ; ; time.Sleep(time.Second) {
		a, err := g.sup.GuestPing(ctx, g.name)
		if err == nil && a.Responding {
			w.Done()
			return
		}
		if w.Expired() || ctx.Err() != nil {
			t.Fatalf("the guest agent does not answer (%+v %v): %s", a, err, w.Explain())
		}
	}
}

// sh runs script in the guest with /bin/sh through the agent and returns
// its stdout; it fails t unless the script exits 0.
func (g *realGuest) sh(t *testing.T, ctx context.Context, script string) string {
	t.Helper()
	out, code := g.shCode(t, ctx, script)
	if code != 0 {
		t.Fatalf("guest: %s: exit %d\n%s", script, code, out)
	}
	return out
}

// shCode is sh that returns the exit code (and stdout with stderr) instead.
func (g *realGuest) shCode(t *testing.T, ctx context.Context, script string) (string, int) {
	t.Helper()
	r, err := g.sup.Exec(ctx, g.name, []string{"/bin/sh", "-c", script}, testenv.GuestBound(time.Minute))
	if err != nil {
		t.Fatalf("guest exec %q: %v", script, err)
	}
	if r.ExitCode != 0 {
		return string(r.Stdout) + string(r.Stderr), r.ExitCode
	}
	return strings.TrimSpace(string(r.Stdout)), 0
}

// ssh runs cmd in the guest as seedUser over ssh to its DHCP address.
func (g *realGuest) ssh(ctx context.Context, cmd string) (string, error) {
	c := exec.CommandContext(ctx, "ssh", "-i", g.key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
		"-o", fmt.Sprintf("ConnectTimeout=%d", int(testenv.GuestBound(30*time.Second).Seconds())),
		seedUser+"@"+g.ip, cmd)
	out, err := c.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// byID is the guest's device for the virtio disk serial, once udev has
// made its /dev/disk/by-id link ("" if it has not within the bound).
func (g *realGuest) byID(t *testing.T, ctx context.Context, serial string) string {
	t.Helper()
	w := testenv.StartGuestWait("udev names a disk by id", 30*time.Second)
	for ; !w.Expired(); time.Sleep(time.Second) {
		if out, code := g.shCode(t, ctx, "readlink -f /dev/disk/by-id/virtio-"+serial); code == 0 && out != "" {
			w.Done()
			return out
		}
	}
	return ""
}

// session is one ssh connection to the guest whose remote side echoes
// each line it reads: a line answered after an operation shows the TCP
// connection survived it.
type session struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// startSession opens the session as seedUser.
func (g *realGuest) startSession(t *testing.T, ctx context.Context) *session {
	t.Helper()
	c := exec.CommandContext(ctx, "ssh", "-i", g.key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", seedUser+"@"+g.ip,
		`while read -r l; do echo "got $l"; done`)
	in, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.Stderr = os.Stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	return &session{cmd: c, in: in, out: bufio.NewReader(out)}
}

// roundTrip sends line and waits, bounded, for its echo.
func (s *session) roundTrip(t *testing.T, line string) {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		l, err := s.out.ReadString('\n')
		if err != nil {
			l = "error: " + err.Error()
		}
		got <- strings.TrimSpace(l)
	}()
	if _, err := io.WriteString(s.in, line+"\n"); err != nil {
		t.Fatalf("ssh session: writing %q: %v", line, err)
	}
	bound := testenv.GuestBound(time.Minute)
	select {
	case l := <-got:
		if l != "got "+line {
			t.Fatalf("ssh session: sent %q, read %q", line, l)
		}
	case <-time.After(bound):
		t.Fatalf("ssh session: no echo of %q within %s", line, bound)
	}
}

// close ends the session: the remote loop ends at EOF.
func (s *session) close() {
	s.in.Close()
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
}
