package realhosttest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

const (
	hostName = "rh" // the host VM
	inner    = "demo"
	// payloadSerial names the host VM's second disk: the package, the tiny
	// guest and the demo's file (/dev/disk/by-id/virtio-PAYLOAD).
	payloadSerial = "payload"
	bootBound     = 8 * time.Minute // a Debian boot under TCG on a quiet host
	// innerBound: the demo's agent answering, under nested KVM (~1.5 min)
	// or nested TCG (~8 min) on a quiet host.
	innerBound = 12 * time.Minute
)

// hostVM is the booted Debian host, driven through its guest agent.
type hostVM struct {
	sup     *supervisor.Supervisor
	console string // its console log
	bootID  string
	accel   string // the demo's accelerator at its first start
}

// hostTOML is the host VM: the image's kernel and initrd with AppArmor on
// the command line, a root overlay on the cached image, the payload disk.
// One vCPU: with two, the host's kernel panicked ("corrupted stack end
// detected inside scheduler") once its nested KVM guest ran on TCG's
// emulated SVM; with one, it boots the demo in ~2 minutes.
func hostTOML(dir, payload string) string {
	return fmt.Sprintf(`name = %q
memory = "3G"
cpus = 1
accel = "tcg"
stop_timeout = "3m"
shutdown = "agent"

[boot]
kernel = %q
initrd = %q
cmdline = "root=/dev/vda ro console=ttyS0 apparmor=1 security=apparmor no_timer_check"

[[disk]]
name = "root"
file = %q
backing = %q

[[disk]]
name = "payload"
file = %q
format = "raw"
read_only = true
serial = %q
`, hostName, filepath.Join(imageDir, "vmlinux"), filepath.Join(imageDir, "initrd.img"),
		filepath.Join(dir, "root.qcow2"), filepath.Join(imageDir, "disk.qcow2"), payload, payloadSerial)
}

// makePayload writes an ext4 image holding vmsup.deb, the tiny guest
// (guest/) and demo.toml.
func makePayload(t *testing.T, ctx context.Context, dir string) string {
	t.Helper()
	g, err := testenv.Guest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(dir, "payload")
	if err := os.MkdirAll(filepath.Join(tree, "guest"), 0o755); err != nil {
		t.Fatal(err)
	}
	for src, dst := range map[string]string{debFile: "vmsup.deb", g.Kernel: "guest/vmlinux", g.Initrd: "guest/initramfs.cpio.gz",
		filepath.Join(root, "examples", "demo.toml"): "demo.toml"} {
		if out, err := exec.Command("cp", src, filepath.Join(tree, dst)).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v %s", src, err, out)
		}
	}
	img := filepath.Join(dir, "payload.img")
	if out, err := exec.Command("truncate", "-s", "256M", img).CombinedOutput(); err != nil {
		t.Fatalf("truncate: %v %s", err, out)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-L", "payload", "-d", tree, img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 -d: %v %s", err, out)
	}
	return img
}

// run runs a shell script in the host VM (stderr joined to stdout) within
// bound (scaled to the host's load) and returns its output and exit code.
func (h *hostVM) run(ctx context.Context, script string, bound time.Duration) (string, int, error) {
	r, err := h.sup.Exec(ctx, hostName, []string{"/bin/sh", "-c", "exec 2>&1; " + script}, testenv.GuestBound(bound))
	if err != nil {
		return "", -1, err
	}
	return strings.TrimSpace(string(r.Stdout)), r.ExitCode, nil
}

// sh is run that fails the test unless the script exits 0.
func (h *hostVM) sh(t *testing.T, ctx context.Context, script string, bound time.Duration) string {
	t.Helper()
	out, code, err := h.run(ctx, script, bound)
	if err != nil || code != 0 {
		t.Fatalf("in the host VM: %s: exit %d, %v\n%s", script, code, err, out)
	}
	return out
}

// consoleTail is the end of the host VM's console log (for failures).
func (h *hostVM) consoleTail() string {
	b, _ := os.ReadFile(h.console)
	return string(b[max(0, len(b)-3000):])
}

// checkPanic fails the test at once when the host VM's kernel panicked: no
// wait can end well then.
func (h *hostVM) checkPanic(t *testing.T) {
	t.Helper()
	b, _ := os.ReadFile(h.console)
	if i := strings.Index(string(b), "Kernel panic"); i >= 0 {
		t.Fatalf("the host VM's kernel panicked:\n%s", b[max(0, i-1500):min(len(b), i+2500)])
	}
}

// waitBoot waits for a boot other than h.bootID with systemd running (or
// degraded: the failed units are logged) and the agent answering.
func (h *hostVM) waitBoot(t *testing.T, ctx context.Context) {
	t.Helper()
	w := testenv.StartGuestWait("the host VM's boot (systemd running, the agent answering)", bootBound)
	var last string
	for {
		out, _, err := h.run(ctx, "cat /proc/sys/kernel/random/boot_id; systemctl is-system-running", 30*time.Second)
		last = fmt.Sprintf("%q %v", out, err)
		if f := strings.Fields(out); err == nil && len(f) == 2 && f[0] != h.bootID && (f[1] == "running" || f[1] == "degraded") {
			h.bootID = f[0]
			if f[1] == "degraded" {
				t.Logf("host VM degraded: %s", h.sh(t, ctx, "systemctl --failed --no-pager --plain", time.Minute))
			}
			t.Logf("host VM booted (%s) in %s", h.bootID, w.Done().Round(time.Second))
			return
		}
		h.checkPanic(t)
		if w.Expired() {
			t.Fatalf("%s; last answer %s; console:\n%s", w.Explain(), last, h.consoleTail())
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(3 * time.Second):
		}
	}
}

// waitInner waits for the demo VM's agent to answer vmsup ping in the host.
func (h *hostVM) waitInner(t *testing.T, ctx context.Context) {
	t.Helper()
	w := testenv.StartGuestWait("the demo VM's agent in the host VM (nested)", innerBound)
	var last string
	for {
		out, code, err := h.run(ctx, "vmsup ping "+inner, 2*time.Minute)
		if err == nil && code == 0 {
			t.Logf("demo VM's agent answered after %s: %s", w.Done().Round(time.Second), out)
			return
		}
		last = fmt.Sprintf("exit %d %v: %s", code, err, out)
		h.checkPanic(t)
		if w.Expired() {
			logs, _, _ := h.run(ctx, "vmsup status "+inner+"; vmsup logs "+inner+" | tail -n 30", time.Minute)
			t.Fatalf("%s; last: %s\n%s", w.Explain(), last, logs)
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(5 * time.Second):
		}
	}
}

// bootHost starts the host VM and waits for its first boot.
func bootHost(t *testing.T, ctx context.Context) *hostVM {
	dir := t.TempDir()
	payload := makePayload(t, ctx, dir)
	sup, err := supervisor.New(supervisor.Options{
		Root:       t.TempDir(),
		SystemdBus: env.Systemd.BusAddress, QEMU: env.QEMU, HostCaps: env.Caps,
		JournalDir: env.Systemd.JournalDir,
		Self:       vmsupBin,
		AllowPaths: append(append([]string{}, env.AllowPaths...), imageDir),
		BlockDirs:  env.BlockDirs,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Close() })
	f := supervisortest.LoadTOML(t, dir, hostName, hostTOML(dir, payload))
	t0 := time.Now()
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.DownWith(context.Background(), hostName, supervisor.DownOptions{Force: true}) })
	st, err := sup.Status(ctx, hostName)
	if err != nil {
		t.Fatal(err)
	}
	h := &hostVM{sup: sup, console: st.ConsoleLog}
	h.waitBoot(t, ctx)
	t.Logf("host VM up and booted in %s", time.Since(t0).Round(time.Second))
	return h
}
