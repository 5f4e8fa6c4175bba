package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"github.com/vishvananda/netlink"
)

// privateNetnsEnv marks a test binary already re-executed in its own
// network namespace.
const privateNetnsEnv = "VMSUP_TEST_PRIVATE_NETNS"

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
func InPrivateNetns() (code int, ok bool) {
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
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		if ee, isExit := err.(*exec.ExitError); isExit {
			return ee.ExitCode(), true
		}
		fmt.Fprintln(os.Stderr, "testenv: re-exec in a private network namespace:", err)
		return 1, true
	}
	return 0, true
}
