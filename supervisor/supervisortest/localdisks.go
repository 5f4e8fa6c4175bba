package supervisortest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
)

// Local disks on two hosts (storage migration's tests): the hosts of
// TwoHosts share one filesystem, so a directory is made local to each:
// B gets a tmpfs of its own at dir in its sandbox's mount namespace, A
// keeps the directory as this test sees it. Whatever touches B's disks
// runs there: its receiver (Transport), its CLI (CLI), its guardians and
// QEMU (B's systemd). A CLI in B's namespaces reaches A's receiver through
// a broker (Broker): paths of this test's /proc do not exist in B's.

// LocalDisks makes dir local to each of a and b (see above).
func LocalDisks(t *testing.T, a, b *Host, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	RunCmd(t, "nsenter", "-t", fmt.Sprint(b.SD.PID1), "-m", "mount", "-t", "tmpfs", "-o", "mode=0755,size=1g", "vmsup-b-disks", dir)
	t.Cleanup(func() { exec.Command("nsenter", "-t", fmt.Sprint(b.SD.PID1), "-m", "umount", "-l", dir).Run() })
	for _, h := range []*Host{a, b} {
		if h.enter == nil {
			h.enter = h.Enter()
		}
	}
}

// Enter is the command prefix that runs a command in h's sandbox's mount
// and PID namespaces.
func (h *Host) Enter() []string {
	return []string{"nsenter", "-t", fmt.Sprint(h.SD.PID1), "-m", "-p", "--"}
}

// env is the environment of a vmsup run as h.
func (h *Host) environ() []string {
	return append(os.Environ(), "VMSUP_ROOT="+h.Root, "VMSUP_SYSTEMD_BUS="+h.SD.BusAddress, "VMSUP_JOURNAL_DIR="+h.SD.JournalDir,
		"VMSUP_QEMU="+h.QEMU, "VMSUP_UNIT_DIR="+h.UnitDir(), "VMSUP_BOOT_TARGET="+testenv.BootTarget,
		"VMSUP_RUN_DIR="+filepath.Join(h.Root, "run"), "VMSUP_ALLOW_PATHS="+strings.Join(h.env.AllowPaths, ":"),
		"VMSUP_BLOCK_DIRS="+strings.Join(h.env.BlockDirs, ":"))
}

// CLIEnter is the prefix of a command run as h: in its network namespace
// and its sandbox's mount and PID namespaces.
func (h *Host) CLIEnter() []string {
	return []string{"nsenter", "--net=" + h.Netns, "-t", fmt.Sprint(h.SD.PID1), "-m", "-p", "--"}
}

// CLI is the command "vmsup ARGS" as h (CLIEnter).
func (h *Host) CLI(ctx context.Context, args ...string) *exec.Cmd {
	argv := append(append(h.CLIEnter()[1:], h.self), args...)
	cmd := exec.CommandContext(ctx, "nsenter", argv...)
	cmd.Env = h.environ()
	return cmd
}

// ReceiverTransportOf is ReceiverTransport into h's namespaces (its
// network's, and its sandbox's mount and PID namespaces once LocalDisks).
func (h *Host) ReceiverTransportOf(j FaultJob) []string {
	j.Op = "migrate-receive"
	b, _ := json.Marshal(j)
	return append(append([]string{"nsenter", "--net=" + h.Netns}, h.enter...), os.Args[0], "-fault-helper", string(b))
}

// Broker returns a transport that reaches h's receiver from any namespace:
// a helper (this test binary) pipes its stdin and stdout to a unix socket
// where this test runs h.Transport for each connection.
func (h *Host) Broker(t *testing.T) []string {
	t.Helper()
	return h.BrokerFor(t, func() []string { return h.Transport("") })
}

// BrokerFor is Broker running argv() for each connection.
func (h *Host) BrokerFor(t *testing.T, argv func() []string) []string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "broker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				// The socket itself as its stdin and stdout (no copying
				// goroutines): when it dies the other end sees EOF at once.
				f, err := c.(*net.UnixConn).File()
				if err != nil {
					return
				}
				defer f.Close()
				argv := argv()
				cmd := exec.Command(argv[0], argv[1:]...)
				cmd.Stdin, cmd.Stdout, cmd.Stderr = f, f, os.Stderr
				if cmd.Start() == nil {
					f.Close()
					c.Close()
					_ = cmd.Wait()
				}
			}()
		}
	}()
	b, _ := json.Marshal(FaultJob{Op: "pipe", Dir: sock})
	return []string{os.Args[0], "-fault-helper", string(b)}
}

// pipe connects stdin and stdout to the unix socket sock (a Broker's
// transport): stdin's end is passed on, the socket's end ends it.
func pipe(sock string) int {
	c, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go func() {
		_, _ = io.Copy(c, os.Stdin)
		_ = c.(*net.UnixConn).CloseWrite()
	}()
	_, _ = io.Copy(os.Stdout, c)
	return 0
}

// LocalDiskGuest writes DIR/NAME.toml for a counter guest with one qcow2
// data disk of 64 MiB at disk (made by its first up), its [[disk]] table
// extended by extra lines, and parses it.
func LocalDiskGuest(t testing.TB, e *testenv.Env, dir, name, disk, extra string) *spec.File {
	t.Helper()
	body := fmt.Sprintf(`name = %q
memory = "256M"
accel = "tcg"
stop_timeout = "`+testenv.GuestBound(5*time.Second).Round(time.Second).String()+`"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check vmsup.counter"

[[disk]]
name = "data"
file = %q
format = "qcow2"
size = "64M"
%s
`, name, e.Guest.Kernel, e.Guest.Initrd, disk, extra)
	return LoadTOML(t, dir, name, body)
}

// StartMarkWriter starts a writer in the guest: marker i ("MARK%08d") in
// sector i+8 of the data disk, each synced (fsync of the device) before
// /synced says i (the sector zero-padded: conv=sync); it runs until
// StopMarkWriter.
func StartMarkWriter(t testing.TB, ctx context.Context, consoleSock string) {
	t.Helper()
	GuestExec(t, ctx, consoleSock, `(i=$(cat /synced 2>/dev/null || echo 0); while :; do i=$((i+1)); `+
		`printf 'MARK%08d' $i | dd of=/dev/vda bs=512 seek=$((i+8)) conv=sync,fsync,notrunc 2>/dev/null && echo $i >/synced; `+
		`sleep 0.05; done) >/dev/null 2>&1 & echo $! >/writer.pid`)
}

// StopMarkWriter stops the writer and returns how many markers it synced.
func StopMarkWriter(t testing.TB, ctx context.Context, consoleSock string) int {
	t.Helper()
	out := GuestExec(t, ctx, consoleSock, `kill $(cat /writer.pid); sleep 0.3; printf 'SYNCED[%s]\n' "$(cat /synced)"`)
	m := regexp.MustCompile(`SYNCED\[(\d+)\]`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no SYNCED[...] in %q", out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// CheckMarks reads the first n markers back from the data disk, the
// guest's page cache dropped (so from its image), and fails the test
// unless every one is there.
func CheckMarks(t testing.TB, ctx context.Context, consoleSock string, n int) {
	t.Helper()
	out := GuestExec(t, ctx, consoleSock, fmt.Sprintf(`dmesg -n 1; echo 3 >/proc/sys/vm/drop_caches; `+
		`dd if=/dev/vda bs=512 skip=9 count=%d 2>/dev/null | tr -d '\000' >/got; `+
		`i=1; while [ $i -le %d ]; do printf 'MARK%%08d' $i; i=$((i+1)); done >/want; `+
		`if cmp -s /got /want; then echo MARKS-OK; else echo MARKS-BAD $(wc -c </got) $(wc -c </want); fi`, n, n))
	if !strings.Contains(out, "MARKS-OK") {
		t.Fatalf("markers 1..%d not all on the disk: %s", n, Tail(out, 300))
	}
}
