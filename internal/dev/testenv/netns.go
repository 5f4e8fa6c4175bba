package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"github.com/vishvananda/netlink"

	"github.com/vmsup/vmsup/netsetup"
)

// privateNetnsEnv marks a test binary already re-executed in its own
// network namespace.
const privateNetnsEnv = "VMSUP_TEST_PRIVATE_NETNS"

// hostMountNSEnv names the mount namespace a test binary was started in,
// for the re-executed one (InPrivateMountNetns): PutQEMU10 refuses it.
const hostMountNSEnv = "VMSUP_TEST_HOST_MOUNTNS"

// InPrivateNetns re-executes the running test binary in a new network
// namespace of its own (with lo up) and returns its exit code, so that
// every link, bridge, tap, OVS daemon and CNI plugin a network test makes
// lives there and never touches the host's interfaces; ok is false in the
// re-executed child (which then runs its tests) or without root. Call it
// first in TestMain:
//
//	if code, ok := testenv.InPrivateNetns(); ok { os.Exit(code) }
//
// The systemd sandbox a test starts afterwards inherits the namespace, so
// QEMU in a unit opens the taps the test made.
func InPrivateNetns() (code int, ok bool) { return inPrivate(0) }

// InPrivateMountNetns is InPrivateNetns with a mount namespace of its own
// as well, all of it private: a mount the tests make in it (PutQEMU10 of
// the test's own process) stays there, and is not seen by the host.
func InPrivateMountNetns() (code int, ok bool) { return inPrivate(syscall.CLONE_NEWNS) }

// inPrivate re-executes the test binary with a new network namespace and
// the namespaces of unshare (CLONE_NEWNS: Go makes "/" recursively private
// in it before the exec).
func inPrivate(unshare uintptr) (code int, ok bool) {
	if os.Getenv(privateNetnsEnv) != "" {
		if lo, err := netlink.LinkByName("lo"); err == nil {
			if err := netlink.LinkSetUp(lo); err != nil {
				fmt.Fprintln(os.Stderr, "testenv: lo up:", err)
			}
		}
		return 0, false
	}
	if os.Geteuid() != 0 {
		return 0, false
	}
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), privateNetnsEnv+"=1")
	if ns, err := os.Readlink("/proc/self/ns/mnt"); err == nil && unshare&syscall.CLONE_NEWNS != 0 {
		cmd.Env = append(cmd.Env, hostMountNSEnv+"="+ns)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Unshareflags: unshare, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		if ee, isExit := err.(*exec.ExitError); isExit {
			return ee.ExitCode(), true
		}
		fmt.Fprintln(os.Stderr, "testenv: re-exec in private namespaces:", err)
		return 1, true
	}
	return 0, true
}

// SandboxNetns makes network namespaces inside the systemd sandbox, where
// units can join them: the sandbox has a private /run, so a namespace
// bind-mounted on the host is invisible to its systemd
// (NetworkNamespacePath= would fail). The host reaches them through PID 1's
// root. It implements netsetup.Netns.
type SandboxNetns struct{ Systemd *Systemd }

// Paths implements netsetup.Netns.
func (n SandboxNetns) Paths(name string) netsetup.NetnsPaths {
	return netsetup.NetnsPaths{
		Host: fmt.Sprintf("/proc/%d/root/run/netns/%s", n.Systemd.PID1, name),
		Unit: "/run/netns/" + name,
	}
}

// Create implements netsetup.Netns with `ip netns add` inside the sandbox.
func (n SandboxNetns) Create(ctx context.Context, name string) (netsetup.NetnsPaths, error) {
	p := n.Paths(name)
	if _, err := os.Stat(p.Host); err == nil {
		return p, fmt.Errorf("netns %s: %w", name, netsetup.ErrExists)
	}
	if _, err := n.Systemd.nsenter(ctx, "ip", "netns", "add", name); err != nil {
		return p, err
	}
	if err := netsetup.SetLoopbackUp(p.Host); err != nil {
		n.Delete(ctx, name)
		return p, err
	}
	return p, nil
}

// Delete implements netsetup.Netns.
func (n SandboxNetns) Delete(ctx context.Context, name string) error {
	if _, err := os.Stat(n.Paths(name).Host); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	_, err := n.Systemd.nsenter(ctx, "ip", "netns", "delete", name)
	return err
}

// List returns the namespaces in the sandbox's /run/netns.
func (n SandboxNetns) List() ([]string, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/root/run/netns", n.Systemd.PID1))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, err
}
