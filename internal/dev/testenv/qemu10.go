package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// QEMU 10 beside the installed 7.2: scripts/install-qemu10.sh unpacks
// Debian 12's backport into a prefix, and scripts/testing/with-qemu10 binds
// its binaries, data directory and modules over 7.2's in a mount
// namespace. PutQEMU10 does that in a namespace that already runs QEMU 7.2
// (a sandbox's, a running VM unit's, the test's own), the way a package
// upgrade replaces the files: what runs keeps its mapped binary, and
// everything started afterwards is QEMU 10.

// QEMU10Prefix is where install-qemu10.sh put QEMU 10: VMSUP_QEMU10, else
// /opt/vmsup/qemu10.
func QEMU10Prefix() string {
	if p := os.Getenv("VMSUP_QEMU10"); p != "" {
		return p
	}
	return "/opt/vmsup/qemu10"
}

// QEMU10Binary is the prefix's qemu-system-x86_64, the file PutQEMU10
// binds over the installed one.
func QEMU10Binary() string {
	return filepath.Join(QEMU10Prefix(), "root/usr/bin/qemu-system-x86_64")
}

// QEMU10Missing says why QEMU 10 cannot be put in place here ("" when it
// can): its prefix lacks it, or the installed QEMU (the one it replaces)
// is 10 already (as under with-qemu10).
func QEMU10Missing() string {
	if _, err := os.Stat(QEMU10Binary()); err != nil {
		return fmt.Sprintf("no QEMU 10 in %s (scripts/install-qemu10.sh puts it there): %v", QEMU10Prefix(), err)
	}
	out, err := exec.Command(QEMUBinary(), "--version").Output()
	if err != nil {
		return fmt.Sprintf("%s --version: %v", QEMUBinary(), err)
	}
	if v := strings.SplitN(string(out), "\n", 2)[0]; strings.Contains(v, "version 10.") {
		return fmt.Sprintf("the installed QEMU is 10 already (%s): nothing to upgrade from", v)
	}
	return ""
}

// QEMU10Skip skips t with QEMU10Missing's reason, or without root.
func QEMU10Skip(t testing.TB) {
	t.Helper()
	SkipUnlessRoot(t)
	if why := QEMU10Missing(); why != "" {
		t.Skip(why)
	}
}

// PutQEMU10 puts QEMU 10 in place of the installed QEMU in the mount
// namespace of process pid (with-qemu10 --bind, entered with nsenter); undo
// takes it away again (--unbind). It refuses the namespace the test binary
// was started in (before InPrivateMountNetns), or its own where it runs in
// that one, and that of /proc/1 where it may look: pid must be in a
// private one, as a sandbox's systemd, its units and a test binary run by
// InPrivateMountNetns are.
func PutQEMU10(ctx context.Context, pid int) (undo func(context.Context) error, err error) {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return nil, fmt.Errorf("testenv: QEMU 10 for process %d: %w", pid, err)
	}
	host := os.Getenv(hostMountNSEnv)
	if host == "" {
		host, _ = os.Readlink("/proc/self/ns/mnt")
	}
	init, _ := os.Readlink("/proc/1/ns/mnt") // not readable from every sandbox
	if ns == host || ns == init {
		return nil, fmt.Errorf("testenv: QEMU 10 for process %d: its mount namespace %s is the host's: refused", pid, ns)
	}
	if err := withQEMU10(ctx, pid, "--bind"); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return withQEMU10(ctx, pid, "--unbind") }, nil
}

// PutQEMU10 puts QEMU 10 in place in the sandbox's mount namespace: the
// units it starts from now on run QEMU 10; those running keep 7.2 and
// their own view of the files (see PutQEMU10 of their processes).
func (s *Systemd) PutQEMU10(ctx context.Context) (undo func(context.Context) error, err error) {
	return PutQEMU10(ctx, s.PID1)
}

// withQEMU10 runs with-qemu10 with mode in the mount (and PID: /proc is
// that of the sandbox there) namespaces of pid.
func withQEMU10(ctx context.Context, pid int, mode string) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	// The script goes in on stdin: the sandbox has a /tmp of its own, where
	// a clone under /tmp (CI's) is not to be found.
	script, err := os.Open(filepath.Join(root, "scripts/testing/with-qemu10"))
	if err != nil {
		return err
	}
	defer script.Close()
	cmd := exec.CommandContext(ctx, "nsenter", "-t", strconv.Itoa(pid), "-m", "-p", "--", "/bin/bash", "-s", "--", mode)
	cmd.Stdin = script
	cmd.Env = append(os.Environ(), "VMSUP_QEMU10="+QEMU10Prefix())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testenv: with-qemu10 %s in the mount namespace of process %d: %w: %s", mode, pid, err, strings.TrimSpace(string(out)))
	}
	return nil
}
